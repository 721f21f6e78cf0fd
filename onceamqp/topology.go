package onceamqp

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue describes a durable work queue and where its dead letters go, as
// DeclareQueue declares them. For example:
//
//	onceamqp.Queue{
//		Name:               "payments.charge",
//		DeadLetterExchange: "payments.dead",
//		DeadLetterQueue:    "payments.charge.dead",
//	}
type Queue struct {
	// Name is the work queue's name. Publishers reach it through the
	// default exchange with Name as the routing key.
	Name string
	// DeadLetterExchange is the durable fanout exchange the queue
	// dead-letters to (x-dead-letter-exchange): where a rejected delivery
	// goes, with RabbitMQ's x-death header. Required: a queue without one
	// drops what the consumer rejects.
	DeadLetterExchange string
	// DeadLetterQueue, when set, is a durable queue bound to
	// DeadLetterExchange that keeps the dead letters.
	DeadLetterQueue string
	// Classic declares classic queues; by default both queues are quorum
	// queues (replicated, and the only kind RabbitMQ keeps developing).
	Classic bool
	// DeliveryLimit sets a quorum queue's x-delivery-limit: the broker
	// dead-letters a message returned that many times. Zero, the default,
	// sets none, which is what the consumer expects: it requeues messages
	// whose key is in flight, failed or handed off, and counts failed
	// executions itself (SettlePolicy.MaxFailures).
	DeliveryLimit int
}

// DeclareQueue declares q's dead-letter exchange, its dead-letter queue
// bound to it, and the work queue, all durable; a declaration that exists
// already with the same arguments changes nothing, so every consumer may
// run it at start (Options.Declare). A queue that exists with other
// arguments is an error (RabbitMQ's PRECONDITION_FAILED), and the channel
// is closed.
func DeclareQueue(ch *amqp.Channel, q Queue) error {
	if q.Name == "" || q.DeadLetterExchange == "" {
		return errors.New("onceamqp: a Queue needs a Name and a DeadLetterExchange")
	}
	if q.Classic && q.DeliveryLimit > 0 {
		return errors.New("onceamqp: DeliveryLimit is a quorum queue's setting")
	}
	kind := amqp.QueueTypeQuorum
	if q.Classic {
		kind = amqp.QueueTypeClassic
	}
	if err := ch.ExchangeDeclare(q.DeadLetterExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("onceamqp: declare exchange %s: %w", q.DeadLetterExchange, err)
	}
	if q.DeadLetterQueue != "" {
		if _, err := ch.QueueDeclare(q.DeadLetterQueue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: kind}); err != nil {
			return fmt.Errorf("onceamqp: declare queue %s: %w", q.DeadLetterQueue, err)
		}
		if err := ch.QueueBind(q.DeadLetterQueue, "", q.DeadLetterExchange, false, nil); err != nil {
			return fmt.Errorf("onceamqp: bind queue %s to %s: %w", q.DeadLetterQueue, q.DeadLetterExchange, err)
		}
	}
	args := amqp.Table{amqp.QueueTypeArg: kind, "x-dead-letter-exchange": q.DeadLetterExchange}
	if q.DeliveryLimit > 0 {
		args["x-delivery-limit"] = q.DeliveryLimit
	}
	if _, err := ch.QueueDeclare(q.Name, true, false, false, false, args); err != nil {
		return fmt.Errorf("onceamqp: declare queue %s: %w", q.Name, err)
	}
	return nil
}
