package oncenats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceonly/onceonly"
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
	disposition, reason := c.settle(ctx, msg, s)
	if c.opts.Settled != nil {
		c.opts.Settled(msg, s)
	}

	c.metrics.messages.WithLabelValues(disposition, reason).Inc()
	c.metrics.duration.WithLabelValues(disposition).Observe(time.Since(start).Seconds())
}

// process runs a message through the engine and returns its settlement.
func (c *Consumer) process(ctx context.Context, msg jetstream.Msg) onceonly.Settlement {
	m, err := c.identify(msg)
	if err != nil {
		return c.opts.Policy.Settle(onceonly.Outcome{}, err)
	}
	var out onceonly.Outcome
	if c.txHandler != nil {
		out, err = c.engine.Do(ctx, m.Scope, m.Key, m.Payload, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			return c.call(ctx, m, func() error { return c.txHandler(ctx, tx, m) })
		})
	} else {
		out, err = c.engine.Run(context.WithValue(ctx, msgKey{}, msg), c.name, m.Scope, m.Key, m.Payload)
	}
	return c.opts.Policy.Settle(out, err)
}

// identify returns the message a JetStream message carries; an error wraps
// onceonly.ErrInvalidMessage (or another error Settle reads as invalid), so
// an invalid message settles before the engine sees it and leaves no key.
//
// A panic in Options.Key, ScopeOf or Payload is such an error too: they
// depend on the message alone, so it would panic again on every delivery.
func (c *Consumer) identify(msg jetstream.Msg) (m Message, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("oncenats: Options.Key, ScopeOf or Payload panicked", "subject", msg.Subject(), "seq", streamSeq(msg), "panic", p)
			err = invalid("identify", fmt.Errorf("panic: %v", p))
		}
	}()
	m = Message{Scope: c.opts.Scope, Payload: msg.Data(), Msg: msg}
	if m.Key, err = c.opts.Key(msg); err != nil {
		return m, invalid("key", err)
	}
	if err := onceonly.ValidateKey(m.Key); err != nil {
		return m, fmt.Errorf("key %q: %w", m.Key, err)
	}
	if c.opts.ScopeOf != nil {
		if m.Scope, err = c.opts.ScopeOf(msg); err != nil {
			return m, invalid("scope", err)
		}
	}
	if c.opts.Payload != nil {
		if m.Payload, err = c.opts.Payload(msg); err != nil {
			return m, invalid("payload", err)
		}
	}
	return m, nil
}

// invalid wraps an error of Options.Key, ScopeOf or Payload in
// onceonly.ErrInvalidMessage, so that Settle dead-letters the message as
// invalid.
func invalid(what string, err error) error {
	if errors.Is(err, onceonly.ErrInvalidMessage) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", onceonly.ErrInvalidMessage, what, err)
}

// execute is the registered onceonly.Func of a Handler. In a resumption
// there is no JetStream message: the handler runs on the stored payload
// alone.
func (c *Consumer) execute(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	m := Message{Scope: x.Scope(), Key: x.Key(), Payload: x.Request()}
	if msg, ok := ctx.Value(msgKey{}).(jetstream.Msg); ok {
		m.Msg = msg
	}
	return c.call(ctx, m, func() error { return c.handler(ctx, m) })
}

// call runs a handler. A panic becomes the execution's error, so the key
// fails and the message comes back, as after any failure, and is
// dead-lettered after SettlePolicy.MaxFailures: a handler that panics on
// one message never takes the process down again and again.
func (c *Consumer) call(ctx context.Context, m Message, fn func() error) (res onceonly.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.ErrorContext(ctx, "oncenats: handler panicked", "key", m.Key, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("oncenats: handler panicked: %v", p)
		}
	}()
	if err := fn(); err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: 200}, nil
}

type msgKey struct{}

// keepInProgress marks msg in progress every interval until the
// returned function is called (which waits for the marking to stop).
func (c *Consumer) keepInProgress(ctx context.Context, msg jetstream.Msg, every time.Duration) (stop func()) {
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				if err := msg.InProgress(); err != nil {
					c.settleError(ctx, opInProgress, msg, err)
				}
			}
		}
	}()
	return func() { close(quit); <-stopped }
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
		reason = reasonExecuted
		if s.Outcome.Replayed {
			reason = reasonReplayed
		}
		return onceonly.Ack.String(), reason
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
	reason = retryReason(s.Err)
	switch reason {
	case reasonFailed:
		c.log.InfoContext(ctx, "oncenats: execution failed; the message comes again", "err", s.Err, "failures", s.Failures, "after", s.After, "seq", streamSeq(msg))
	case reasonError:
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

// retryReason names why a delivery comes again, for the metrics.
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
