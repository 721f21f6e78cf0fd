package oncenats

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// HeaderKey returns an Options.Key that takes the key from header name. A
// message without it is invalid.
func HeaderKey(name string) func(msg jetstream.Msg) (string, error) {
	return func(msg jetstream.Msg) (string, error) {
		key := msg.Headers().Get(name)
		if key == "" {
			return "", fmt.Errorf("no %s header", name)
		}
		return key, nil
	}
}

// handle runs one message and settles it; progress is how often it is
// marked in progress meanwhile.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg, progress time.Duration) {
	start := time.Now()
	c.metrics.inFlight.Inc()
	defer c.metrics.inFlight.Dec()

	keep := c.keepInProgress(ctx, msg, progress)
	s := c.process(ctx, msg)
	keep()
	if err := consume.Fatal(s); err != nil {
		// No message can get past it: the consumer stops, and hands the
		// message back unsettled, for the consumer that runs once it is
		// fixed.
		c.life.Fail(err)
		c.handBack(ctx, msg)
		return
	}
	disposition, reason := c.settle(ctx, msg, s)
	if c.opts.Settled != nil {
		c.opts.Settled(msg, s)
	}

	c.metrics.messages.WithLabelValues(disposition, reason).Inc()
	c.metrics.duration.WithLabelValues(disposition).Observe(time.Since(start).Seconds())
}

// handleBatch runs msgs as one batch (consume.Executor.SettleBatch) and,
// once it committed, settles each message, all at once, then reports them
// to Options.Settled in the batch's order; progress is how often they are
// marked in progress meanwhile.
func (c *Consumer) handleBatch(ctx context.Context, msgs []jetstream.Msg, progress time.Duration) {
	if len(msgs) == 1 {
		c.handle(ctx, msgs[0], progress)
		return
	}
	start := time.Now()
	c.metrics.inFlight.Add(float64(len(msgs)))
	defer c.metrics.inFlight.Sub(float64(len(msgs)))

	keep := c.keepAllInProgress(ctx, msgs, progress)
	settled := c.exec.SettleBatch(ctx, msgs)
	keep()
	type outcome struct{ disposition, reason string }
	outcomes := make([]*outcome, len(msgs)) // nil: handed back
	var wg sync.WaitGroup
	for i, msg := range msgs {
		if err := consume.Fatal(settled[i]); err != nil {
			c.life.Fail(err)
			c.handBack(ctx, msg)
			continue
		}
		wg.Go(func() {
			disposition, reason := c.settle(ctx, msg, settled[i])
			outcomes[i] = &outcome{disposition, reason}
		})
	}
	wg.Wait()
	for i, o := range outcomes {
		if o == nil {
			continue
		}
		if c.opts.Settled != nil {
			c.opts.Settled(msgs[i], settled[i])
		}
		c.metrics.messages.WithLabelValues(o.disposition, o.reason).Inc()
		c.metrics.duration.WithLabelValues(o.disposition).Observe(time.Since(start).Seconds())
	}
}

// keepAllInProgress marks each of msgs in progress every interval until
// the returned function is called (which waits for the marking to stop).
func (c *Consumer) keepAllInProgress(ctx context.Context, msgs []jetstream.Msg, every time.Duration) (stop func()) {
	return consume.Every(every, func() {
		for _, msg := range msgs {
			if err := msg.InProgress(); err != nil {
				c.settleError(ctx, opInProgress, msg, err)
			}
		}
	})
}

// process runs a message through the engine and returns its settlement.
func (c *Consumer) process(ctx context.Context, msg jetstream.Msg) onceonly.Settlement {
	return c.exec.Settle(ctx, msg)
}

// config is the consumer's configuration of its executor.
func (c *Consumer) config() consume.Config[jetstream.Msg] {
	return consume.Config[jetstream.Msg]{
		Package:    "oncenats",
		Engine:     c.engine,
		Identifier: identifier(c.opts),
		Policy:     c.opts.Policy,
		Logger:     c.log,
		Attrs:      func(msg jetstream.Msg) []any { return []any{"subject", msg.Subject(), "seq", streamSeq(msg)} },
	}
}

// identifier takes a message's identity as opts say: Key, Scope or
// ScopeOf, Payload or the data.
func identifier(opts Options) consume.Identifier[jetstream.Msg] {
	return consume.Identifier[jetstream.Msg]{
		Scope:   opts.Scope,
		ScopeOf: opts.ScopeOf,
		Key:     opts.Key,
		Payload: opts.Payload,
		Body:    func(msg jetstream.Msg) []byte { return msg.Data() },
	}
}

// message is the Message a handler gets: msg is nil in a resumption.
func message(id consume.Identity, msg jetstream.Msg) Message {
	return Message{Scope: id.Scope, Key: id.Key, Payload: id.Payload, Msg: msg}
}

// keepInProgress marks msg in progress every interval until the
// returned function is called (which waits for the marking to stop).
func (c *Consumer) keepInProgress(ctx context.Context, msg jetstream.Msg, every time.Duration) (stop func()) {
	return c.keepAllInProgress(ctx, []jetstream.Msg{msg}, every)
}

// settle does on the server what s says and returns the disposition and
// reason it counts under.
func (c *Consumer) settle(ctx context.Context, msg jetstream.Msg, s onceonly.Settlement) (disposition, reason string) {
	switch s.Disposition {
	case onceonly.Ack:
		// Confirmed by the server: an ack lost on the way leaves the
		// message to come back after AckWait and be acked as a replay.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.AckTimeout)
		defer cancel()
		if err := msg.DoubleAck(actx); err != nil {
			c.settleError(ctx, opAck, msg, err)
		}
		return onceonly.Ack.String(), consume.Reason(s)
	case onceonly.DeadLetter:
		if err := c.deadLetter(ctx, msg, s); err != nil {
			// Not parked: it comes back, and is dead-lettered then.
			c.settleError(ctx, opDeadLetter, msg, err)
			c.nak(ctx, msg, c.opts.Policy.Backoff(1))
			return onceonly.Retry.String(), reasonDeadLetterFailed
		}
		c.log.WarnContext(ctx, "oncenats: message dead-lettered", "reason", s.Reason, "err", s.Err,
			"subject", msg.Subject(), "seq", streamSeq(msg), "dead_letter_subject", c.opts.DeadLetterSubject)
		c.term(ctx, msg, s.Reason)
		return onceonly.DeadLetter.String(), s.Reason
	case onceonly.Retry:
	}
	reason = consume.RetryReason(s.Err)
	switch reason {
	case consume.ReasonFailed:
		c.log.InfoContext(ctx, "oncenats: execution failed; the message comes again", "err", s.Err, "failures", s.Failures, "after", s.After, "seq", streamSeq(msg))
	case consume.ReasonError:
		c.log.WarnContext(ctx, "oncenats: message not settled; it comes again", "err", s.Err, "after", s.After, "seq", streamSeq(msg))
	}
	c.nak(ctx, msg, s.After)
	return onceonly.Retry.String(), reason
}

// nak asks the server to deliver msg again after delay. It does not
// count as a failure here, but JetStream counts it as a delivery.
func (c *Consumer) nak(ctx context.Context, msg jetstream.Msg, delay time.Duration) {
	if err := msg.NakWithDelay(delay); err != nil {
		c.settleError(ctx, opNak, msg, err)
	}
}

// term terminates msg: the server never delivers it again. With a reason
// where the server keeps one (2.10.4 and later: it is in the
// MSG_TERMINATED advisory); older servers ignore a reason and would
// deliver the message again.
func (c *Consumer) term(ctx context.Context, msg jetstream.Msg, reason string) {
	var err error
	if termTakesReason(c.opts.JetStream.Conn().ConnectedServerVersion()) {
		err = msg.TermWithReason(reason)
	} else {
		err = msg.Term()
	}
	if err != nil {
		c.settleError(ctx, opTerm, msg, err)
	}
}

// deadLetter publishes a copy of msg on the dead-letter subject: its
// data, its headers but those the server reads as directives (Nats-*),
// Nats-Msg-Id dead/<stream sequence> (so a copy published again after a
// crash before the Term is dropped as a duplicate), the reason, the error
// and the original subject.
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, s onceonly.Settlement) error {
	if c.opts.DeadLetterSubject == "" {
		return nil
	}
	h := nats.Header{}
	for name, values := range msg.Headers() {
		if !isServerHeader(name) {
			h[name] = append([]string(nil), values...)
		}
	}
	h.Set(nats.MsgIdHdr, "dead/"+strconv.FormatUint(streamSeq(msg), 10))
	h.Set(HeaderReason, s.Reason)
	h.Set(HeaderSubject, msg.Subject())
	if s.Err != nil {
		h.Set(HeaderError, truncate(s.Err.Error(), 1024))
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.AckTimeout)
	defer cancel()
	_, err := c.opts.JetStream.PublishMsg(pctx, &nats.Msg{Subject: c.opts.DeadLetterSubject, Header: h, Data: msg.Data()})
	if err != nil {
		return fmt.Errorf("publish the dead letter on %s: %w", c.opts.DeadLetterSubject, err)
	}
	return nil
}

func (c *Consumer) settleError(ctx context.Context, op string, msg jetstream.Msg, err error) {
	c.metrics.settleErrors.WithLabelValues(op).Inc()
	c.log.WarnContext(ctx, "oncenats: "+op+" failed", "err", err, "subject", msg.Subject(), "seq", streamSeq(msg))
}

// streamSeq returns the message's sequence in its stream (0 when its
// metadata cannot be read).
func streamSeq(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// isServerHeader reports whether a header is one the server acts on at
// publication (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup, Nats-TTL…), which
// a dead letter must not repeat.
func isServerHeader(name string) bool {
	return len(name) >= 5 && strings.EqualFold(name[:5], "Nats-")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
