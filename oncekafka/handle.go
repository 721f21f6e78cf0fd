package oncekafka

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// HeaderKey returns an Options.Key that takes the key from header name (the
// last one of that name). A record without it is invalid.
func HeaderKey(name string) func(rec *kgo.Record) (string, error) {
	return func(rec *kgo.Record) (string, error) {
		for _, h := range slices.Backward(rec.Headers) {
			if h.Key == name && len(h.Value) > 0 {
				return string(h.Value), nil
			}
		}
		return "", fmt.Errorf("no %s header", name)
	}
}

// handle runs one record and settles it; on an error no record can get
// past (consume.Fatal) it stops the consumer instead, and leaves the record
// unsettled: no offset is committed over it, and it runs again in the
// group's next member (or this one, restarted once the cause is fixed).
func (c *Consumer) handle(ctx context.Context, s *session, it *item) {
	start := time.Now()
	c.metrics.inFlight.Inc()
	defer c.metrics.inFlight.Dec()

	st := c.exec.Settle(ctx, it.rec)
	if err := consume.Fatal(st); err != nil {
		c.metrics.records.WithLabelValues(onceonly.Retry.String(), consume.ReasonStopped).Inc()
		c.life.Fail(err)
		return
	}
	var disposition, reason string
	switch st.Disposition {
	case onceonly.Ack:
		s.settle(it)
		disposition, reason = onceonly.Ack.String(), consume.Reason(st)
	case onceonly.DeadLetter:
		if err := c.deadLetter(ctx, s.cl, it.rec, st); err != nil {
			// Not settled: it runs again, and is dead-lettered then.
			c.metrics.errors.WithLabelValues(opDeadLetter).Inc()
			c.log.WarnContext(ctx, "oncekafka: dead letter not produced; the record runs again", append(attrs(it.rec), "err", err)...)
			s.retry(it, c.opts.Policy.Backoff(1))
			disposition, reason = onceonly.Retry.String(), reasonDeadLetterFailed
			break
		}
		c.log.WarnContext(ctx, "oncekafka: record dead-lettered", append(attrs(it.rec), "reason", st.Reason, "err", st.Err, "dead_letter_topic", c.opts.DeadLetterTopic)...)
		s.settle(it)
		disposition, reason = onceonly.DeadLetter.String(), st.Reason
	case onceonly.Retry:
		reason = consume.RetryReason(st.Err)
		switch reason {
		case consume.ReasonFailed:
			c.log.InfoContext(ctx, "oncekafka: execution failed; the record runs again", append(attrs(it.rec), "err", st.Err, "failures", st.Failures, "after", st.After)...)
		case consume.ReasonError:
			c.log.WarnContext(ctx, "oncekafka: record not settled; it runs again", append(attrs(it.rec), "err", st.Err, "after", st.After)...)
		}
		s.retry(it, st.After)
		disposition = onceonly.Retry.String()
	}
	if c.opts.Settled != nil {
		c.opts.Settled(it.rec, st)
	}
	c.metrics.records.WithLabelValues(disposition, reason).Inc()
	c.metrics.duration.WithLabelValues(disposition).Observe(time.Since(start).Seconds())
}

// deadLetter produces a copy of rec on the dead-letter topic: its key,
// value and headers, and the reason, the error and where rec is.
func (c *Consumer) deadLetter(ctx context.Context, cl *kgo.Client, rec *kgo.Record, s onceonly.Settlement) error {
	if c.opts.DeadLetterTopic == "" {
		return nil
	}
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+5)
	h = append(h, rec.Headers...)
	h = append(h,
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(s.Reason)},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(rec.Partition)))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(rec.Offset, 10))},
	)
	if s.Err != nil {
		h = append(h, kgo.RecordHeader{Key: HeaderError, Value: []byte(truncate(s.Err.Error(), 1024))})
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RequestTimeout)
	defer cancel()
	dead := &kgo.Record{Topic: c.opts.DeadLetterTopic, Key: rec.Key, Value: rec.Value, Headers: h}
	if err := cl.ProduceSync(pctx, dead).FirstErr(); err != nil {
		return fmt.Errorf("produce the dead letter to %s: %w", c.opts.DeadLetterTopic, err)
	}
	return nil
}

// config is the consumer's configuration of its executor.
func (c *Consumer) config() consume.Config[*kgo.Record] {
	return consume.Config[*kgo.Record]{
		Package:    "oncekafka",
		Engine:     c.engine,
		Identifier: identifier(c.opts),
		Policy:     c.opts.Policy,
		Logger:     c.log,
		Attrs:      attrs,
	}
}

// identifier takes a record's identity as opts say: Key, Scope or ScopeOf,
// Payload or the value.
func identifier(opts Options) consume.Identifier[*kgo.Record] {
	return consume.Identifier[*kgo.Record]{
		Scope:   opts.Scope,
		ScopeOf: opts.ScopeOf,
		Key:     opts.Key,
		Payload: opts.Payload,
		Body:    func(rec *kgo.Record) []byte { return rec.Value },
	}
}

// message is the Message a handler gets: rec is nil in a resumption.
func message(id consume.Identity, rec *kgo.Record) Message {
	return Message{Scope: id.Scope, Key: id.Key, Payload: id.Payload, Record: rec}
}

func attrs(rec *kgo.Record) []any {
	return []any{"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
