package onceamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly"
)

// MessageID is the default Options.Key: the message-id property. A
// delivery without one is invalid.
func MessageID(d *amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", errors.New("no message-id property")
	}
	return d.MessageId, nil
}

// HeaderKey returns an Options.Key that takes the key from the string
// header name (say "Idempotency-Key"). A delivery without it, or with a
// value that is not a string, is invalid.
func HeaderKey(name string) func(d *amqp.Delivery) (string, error) {
	return func(d *amqp.Delivery) (string, error) {
		v, ok := d.Headers[name]
		if !ok {
			return "", fmt.Errorf("no %s header", name)
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("header %s is a %T, not a string", name, v)
		}
		return s, nil
	}
}

// handle runs one delivery and settles it.
func (c *Consumer) handle(ctx context.Context, d amqp.Delivery) {
	c.settle(ctx, &d, c.process(ctx, &d))
}

// process runs a delivery through the engine and returns its settlement.
func (c *Consumer) process(ctx context.Context, d *amqp.Delivery) onceonly.Settlement {
	msg, err := c.identify(d)
	if err != nil {
		return c.opts.Policy.Settle(onceonly.Outcome{}, err)
	}
	var out onceonly.Outcome
	if c.txHandler != nil {
		out, err = c.engine.Do(ctx, msg.Scope, msg.Key, msg.Payload, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			return done(recovered(func() error { return c.txHandler(ctx, tx, msg) }))
		})
	} else {
		out, err = c.engine.Run(context.WithValue(ctx, deliveryKey{}, d), c.name, msg.Scope, msg.Key, msg.Payload)
	}
	return c.opts.Policy.Settle(out, err)
}

// identify returns the message a delivery carries; an error wraps
// onceonly.ErrInvalidMessage (or another error Settle reads as invalid).
// A panic in Options.Key, ScopeOf or Payload is such an error too: they
// depend on the delivery alone, so it would panic again on every
// redelivery.
func (c *Consumer) identify(d *amqp.Delivery) (msg Message, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("onceamqp: Options.Key, ScopeOf or Payload panicked", "message_id", d.MessageId, "panic", p)
			err = invalid("identify", fmt.Errorf("panic: %v", p))
		}
	}()
	msg = Message{Scope: c.opts.Scope, Payload: d.Body, Delivery: d}
	if msg.Key, err = c.opts.Key(d); err != nil {
		return msg, invalid("key", err)
	}
	if err := onceonly.ValidateKey(msg.Key); err != nil {
		return msg, fmt.Errorf("key %q: %w", msg.Key, err)
	}
	if c.opts.ScopeOf != nil {
		if msg.Scope, err = c.opts.ScopeOf(d); err != nil {
			return msg, invalid("scope", err)
		}
	}
	if c.opts.Payload != nil {
		if msg.Payload, err = c.opts.Payload(d); err != nil {
			return msg, invalid("payload", err)
		}
	}
	return msg, nil
}

// invalid wraps an error of Options.Key, ScopeOf or Payload in
// onceonly.ErrInvalidMessage, so that Settle dead-letters the delivery as
// invalid.
func invalid(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", onceonly.ErrInvalidMessage, what, err)
}

// execute is the registered onceonly.Func of a Handler. In a resumption
// there is no delivery: the handler runs on the stored payload alone.
func (c *Consumer) execute(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	msg := Message{Scope: x.Scope(), Key: x.Key(), Payload: x.Request()}
	if d, ok := ctx.Value(deliveryKey{}).(*amqp.Delivery); ok {
		msg.Delivery = d
	}
	return done(recovered(func() error { return c.handler(ctx, msg) }))
}

// done is the Result of a handler that returned err: stored (200) when nil.
func done(err error) (onceonly.Result, error) {
	if err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: 200}, nil
}

// recovered runs fn and turns a panic into an error, so that a handler's
// panic fails its execution (counted toward MaxFailures, as asynq counts
// one) instead of ending the consumer's process.
func recovered(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("onceamqp: handler panicked: %v", p)
		}
	}()
	return fn()
}

type deliveryKey struct{}

// settle tells the broker what becomes of d: ack it, requeue it after
// s.After, or reject it to the queue's dead-letter exchange.
func (c *Consumer) settle(ctx context.Context, d *amqp.Delivery, s onceonly.Settlement) {
	reason := reasonOf(s)
	c.metrics.deliveries.WithLabelValues(s.Disposition.String(), reason).Inc()
	log := c.log.With("message_id", d.MessageId, "delivery_tag", d.DeliveryTag, "redelivered", d.Redelivered)
	switch s.Disposition {
	case onceonly.Ack:
		c.report(log, "ack", d.Ack(false))
	case onceonly.DeadLetter:
		log.WarnContext(ctx, "onceamqp: dead-lettering the message", "reason", s.Reason, "failures", s.Failures, "error", s.Err)
		c.report(log, "reject", d.Reject(false))
	case onceonly.Retry:
		level := slog.LevelInfo
		if reason == reasonInFlight {
			level = slog.LevelDebug // a copy of a message under way: routine
		}
		log.Log(ctx, level, "onceamqp: requeueing the message later", "why", reason, "after", s.After, "failures", s.Failures, "error", s.Err)
		c.holds.add(s.After, func() { c.report(log, "nack", d.Nack(false, true)) })
	}
	if c.opts.Settled != nil {
		c.opts.Settled(d, s)
	}
}

// report logs and counts a settlement that did not reach the broker: its
// channel is gone, and the broker redelivers the message.
func (c *Consumer) report(log *slog.Logger, verb string, err error) {
	if err == nil {
		return
	}
	c.metrics.settleErrors.Inc()
	log.Debug("onceamqp: settlement not sent: the channel is gone and the broker redelivers the message", "verb", verb, "error", err)
}

// The reason label of onceonly_amqp_deliveries_total, besides the
// dead-letter reasons of onceonly (reused, invalid, failed).
const (
	reasonExecuted  = "executed"
	reasonReplayed  = "replayed"
	reasonInFlight  = "in_flight"
	reasonHandedOff = "handed_off"
	reasonFailed    = "failed"
	reasonError     = "error"
)

// reasonOf names why a delivery was settled as it was.
func reasonOf(s onceonly.Settlement) string {
	switch s.Disposition {
	case onceonly.Ack:
		if s.Outcome.Replayed {
			return reasonReplayed
		}
		return reasonExecuted
	case onceonly.DeadLetter:
		return s.Reason
	case onceonly.Retry:
		return retryReason(s.Err)
	}
	return reasonError
}

// retryReason names why a delivery comes again: the error of its
// settlement.
func retryReason(err error) string {
	if _, ok := onceonly.IsInFlight(err); ok {
		return reasonInFlight
	}
	if failed, ok := errors.AsType[*onceonly.ExecutionError](err); ok {
		if failed.HandedOff {
			return reasonHandedOff
		}
		return reasonFailed
	}
	return reasonError
}
