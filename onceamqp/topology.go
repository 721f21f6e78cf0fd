package onceamqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	// DeadLetters is how a quorum work queue hands its dead letters to
	// the dead-letter exchange: AtLeastOnce, the default, or AtMostOnce.
	// Classic queues have no choice (at most once).
	DeadLetters DeadLetterStrategy
	// DeliveryLimit sets a quorum queue's x-delivery-limit: the broker
	// dead-letters a message returned more times than that. Zero, the
	// default, means no limit, which is what the consumer expects: it
	// requeues messages whose key is in flight, failed or handed off, and
	// counts failed executions itself (SettlePolicy.MaxFailures). For no
	// limit DeclareQueue declares x-delivery-limit -1 on RabbitMQ 4.0 and
	// later (whose default is 20) and no argument before 4.0 (where -1
	// would dead-letter every message at its first return), on the
	// dead-letter queue too whatever the limit: it has no dead-letter
	// exchange, so a limit there would drop messages. DeliveryLimitUnset
	// declares the argument on neither queue, on any version: the
	// broker's default, or a policy's delivery-limit.
	DeliveryLimit int
}

// DeliveryLimitUnset, as Queue.DeliveryLimit, declares a quorum queue
// without x-delivery-limit, whatever the broker's version: for a queue
// declared so before, whose limit a policy sets (see DeclareQueue).
const DeliveryLimitUnset = -1

// DeadLetterStrategy is how a quorum queue moves a dead letter to its
// dead-letter exchange (x-dead-letter-strategy, RabbitMQ 3.10 and later).
type DeadLetterStrategy int

const (
	// AtLeastOnce, the default, keeps each dead letter in the work queue
	// until every queue it is routed to confirmed it: none is lost when a
	// target is not ready (a broker restarting, a leader moving), and a
	// dead letter may arrive twice. It declares
	// x-dead-letter-strategy at-least-once and the overflow it requires,
	// x-overflow reject-publish: a work queue at its length limit (a
	// policy's max-length or max-length-bytes; DeclareQueue sets none)
	// refuses new messages, and publishers get nacks, instead of dropping
	// its oldest message; dead letters not yet confirmed count against
	// that limit.
	AtLeastOnce DeadLetterStrategy = iota
	// AtMostOnce declares neither argument: RabbitMQ's default strategy,
	// which publishes a dead letter once, without confirms, and loses it
	// when its target is not ready; a full queue drops its oldest
	// message. A policy's dead-letter-strategy and overflow still apply,
	// which is how a queue declared without them before gets at least
	// once (see DeclareQueue).
	AtMostOnce
)

// Queue arguments DeclareQueue sets.
const (
	argDeadLetterExchange = "x-dead-letter-exchange"
	argDeadLetterStrategy = "x-dead-letter-strategy"
	argOverflow           = "x-overflow"
	argDeliveryLimit      = "x-delivery-limit"
)

// DeclareQueue declares q's dead-letter exchange, its dead-letter queue
// bound to it, and the work queue, all durable, on a channel of its own on
// conn; a declaration that exists already with the same arguments changes
// nothing, so every consumer may run it at start (Options.Declare), and
// publishers too. A quorum work queue gets at-least-once dead-lettering
// unless q.DeadLetters says AtMostOnce, and no delivery limit unless
// q.DeliveryLimit sets one; both queues of a kind (quorum by default).
//
// A queue that exists with other arguments cannot be changed by a
// declaration: RabbitMQ refuses it (PRECONDITION_FAILED, 406), and
// DeclareQueue returns that error with what to do. For a work queue
// declared by an earlier onceamqp (without x-dead-letter-strategy and
// x-overflow, and without x-delivery-limit on RabbitMQ 4), either set the
// arguments with a policy and keep declaring the queue as before
// (DeadLetters AtMostOnce, DeliveryLimit DeliveryLimitUnset), for example
//
//	rabbitmqctl set_policy onceamqp-dead-letters '^payments\.charge$' \
//	  '{"dead-letter-strategy":"at-least-once","overflow":"reject-publish"}' \
//	  --apply-to queues
//
// (with "delivery-limit":-1 too on RabbitMQ 4; a queue takes one policy
// only, so merge these keys into a policy that matches it already), or
// move the queue's messages to a queue declared anew.
// docs/consumers/rabbitmq.md has both.
func DeclareQueue(conn *amqp.Connection, q Queue) error {
	args, err := q.arguments(conn.Properties)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("onceamqp: declare queue %s: open a channel: %w", q.Name, err)
	}
	// A refused declaration closed the channel already.
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(q.DeadLetterExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("onceamqp: declare exchange %s: %w", q.DeadLetterExchange, err)
	}
	if q.DeadLetterQueue != "" {
		if err := declare(ch, q.DeadLetterQueue, args.dead); err != nil {
			return err
		}
		if err := ch.QueueBind(q.DeadLetterQueue, "", q.DeadLetterExchange, false, nil); err != nil {
			return fmt.Errorf("onceamqp: bind queue %s to %s: %w", q.DeadLetterQueue, q.DeadLetterExchange, err)
		}
	}
	return declare(ch, q.Name, args.work)
}

// declare declares a durable queue; a refusal because the queue exists
// with other arguments says what to do about it.
func declare(ch *amqp.Channel, name string, args amqp.Table) error {
	_, err := ch.QueueDeclare(name, true, false, false, false, args)
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed {
		return fmt.Errorf("onceamqp: declare queue %s: it exists with other arguments, which a declaration cannot change: "+
			"set them with a policy and declare it as before (Queue.DeadLetters AtMostOnce, Queue.DeliveryLimit DeliveryLimitUnset), "+
			"or move it to a new queue (docs/consumers/rabbitmq.md, \"Queues declared before\"): %w", name, err)
	}
	if err != nil {
		return fmt.Errorf("onceamqp: declare queue %s: %w", name, err)
	}
	return nil
}

// queueArgs are the arguments of the work queue and of the dead-letter
// queue.
type queueArgs struct {
	work, dead amqp.Table
}

// arguments checks q and returns its queues' arguments for the broker
// whose server properties are server.
func (q Queue) arguments(server amqp.Table) (queueArgs, error) {
	switch {
	case q.Name == "" || q.DeadLetterExchange == "":
		return queueArgs{}, errors.New("onceamqp: a Queue needs a Name and a DeadLetterExchange")
	case q.DeliveryLimit < DeliveryLimitUnset:
		return queueArgs{}, errors.New("onceamqp: Queue.DeliveryLimit must be positive, zero (no limit) or DeliveryLimitUnset")
	case q.DeadLetters != AtLeastOnce && q.DeadLetters != AtMostOnce:
		return queueArgs{}, fmt.Errorf("onceamqp: Queue.DeadLetters %d is neither AtLeastOnce nor AtMostOnce", q.DeadLetters)
	case q.Classic && q.DeliveryLimit != 0:
		return queueArgs{}, errors.New("onceamqp: DeliveryLimit is a quorum queue's setting")
	case q.Classic:
		return queueArgs{
			work: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic, argDeadLetterExchange: q.DeadLetterExchange},
			dead: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic},
		}, nil
	}
	args := queueArgs{
		work: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, argDeadLetterExchange: q.DeadLetterExchange},
		dead: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum},
	}
	if q.DeadLetters == AtLeastOnce {
		args.work[argDeadLetterStrategy] = "at-least-once"
		args.work[argOverflow] = "reject-publish"
	}
	if q.DeliveryLimit == DeliveryLimitUnset {
		return args, nil
	}
	// No limit on the dead-letter queue either: on RabbitMQ 4 a dead
	// letter requeued 20 times would be dropped (that queue has no
	// dead-letter exchange of its own).
	unlimited, declared, err := noDeliveryLimit(server)
	switch {
	case q.DeliveryLimit > 0:
		args.work[argDeliveryLimit] = q.DeliveryLimit
	case err != nil:
		return queueArgs{}, err
	case declared:
		args.work[argDeliveryLimit] = unlimited
	}
	if declared {
		args.dead[argDeliveryLimit] = unlimited
	}
	return args, nil
}

// noDeliveryLimit returns the x-delivery-limit that means no limit on the
// broker whose server properties are server, and whether to declare it at
// all: -1 from RabbitMQ 4.0 on, whose quorum queues have a limit of 20 by
// default; before 4.0 no argument, the default there, as -1 is a limit
// that dead-letters every message at its first return.
func noDeliveryLimit(server amqp.Table) (limit int, declared bool, err error) {
	version, _ := server["version"].(string)
	majorText, _, _ := strings.Cut(version, ".")
	major, err := strconv.Atoi(majorText)
	if err != nil {
		return 0, false, fmt.Errorf("onceamqp: the broker's version %q has no major version, on which "+
			"the x-delivery-limit that means no limit depends: set Queue.DeliveryLimit to a limit or DeliveryLimitUnset", version)
	}
	if major >= 4 {
		return -1, true, nil
	}
	return 0, false, nil
}
