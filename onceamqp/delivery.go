package onceamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
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

// handle runs one delivery and settles it; on an error no delivery can
// get past (consume.Fatal) it stops the consumer instead, and leaves the
// delivery unsettled: the broker requeues it when the channel closes.
func (c *Consumer) handle(ctx context.Context, d amqp.Delivery) {
	s := c.process(ctx, &d)
	if err := consume.Fatal(s); err != nil {
		c.metrics.deliveries.WithLabelValues(onceonly.Retry.String(), consume.ReasonStopped).Inc()
		c.life.Fail(err)
		return
	}
	c.settle(ctx, &d, s)
}

// handleBatch runs ds as one batch (consume.Executor.SettleBatch) and,
// once it committed, settles each delivery; on an error no delivery can
// get past (consume.Fatal) it stops the consumer instead, as handle does.
func (c *Consumer) handleBatch(ctx context.Context, ds []amqp.Delivery) {
	if len(ds) == 1 {
		c.handle(ctx, ds[0])
		return
	}
	ptrs := make([]*amqp.Delivery, len(ds))
	for i := range ds {
		ptrs[i] = &ds[i]
	}
	for i, s := range c.exec.SettleBatch(ctx, ptrs) {
		if err := consume.Fatal(s); err != nil {
			c.metrics.deliveries.WithLabelValues(onceonly.Retry.String(), consume.ReasonStopped).Inc()
			c.life.Fail(err)
			continue
		}
		c.settle(ctx, ptrs[i], s)
	}
}

// process runs a delivery through the engine and returns its settlement.
func (c *Consumer) process(ctx context.Context, d *amqp.Delivery) onceonly.Settlement {
	return c.exec.Settle(ctx, d)
}

// config is the consumer's configuration of its executor.
func (c *Consumer) config() consume.Config[*amqp.Delivery] {
	return consume.Config[*amqp.Delivery]{
		Package:    "onceamqp",
		Engine:     c.engine,
		Identifier: identifier(c.opts),
		Policy:     c.opts.Policy,
		Logger:     c.log,
		Attrs:      func(d *amqp.Delivery) []any { return []any{"message_id", d.MessageId} },
	}
}

// identifier takes a delivery's identity as opts say: Key, Scope or
// ScopeOf, Payload or the body.
func identifier(opts Options) consume.Identifier[*amqp.Delivery] {
	return consume.Identifier[*amqp.Delivery]{
		Scope:   opts.Scope,
		ScopeOf: opts.ScopeOf,
		Key:     opts.Key,
		Payload: opts.Payload,
		Body:    func(d *amqp.Delivery) []byte { return d.Body },
	}
}

// message is the Message a handler gets: d is nil in a resumption.
func message(id consume.Identity, d *amqp.Delivery) Message {
	return Message{Scope: id.Scope, Key: id.Key, Payload: id.Payload, Delivery: d}
}

// settle tells the broker what becomes of d: ack it, requeue it after
// s.After, or reject it to the queue's dead-letter exchange.
func (c *Consumer) settle(ctx context.Context, d *amqp.Delivery, s onceonly.Settlement) {
	reason := consume.Reason(s)
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
		if reason == consume.ReasonInFlight {
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
