package oncesqs_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/onceonly/onceonly/oncesqs"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkConsumer measures what the exactly-once consumer costs against
// a bare one on the same client and server (goaws behind the test front):
// a backlog of BENCH_MESSAGES (default 500) messages, each with a key of
// its own, drained by BENCH_WORKERS (default 8) workers, either by a
// Consumer whose handler inserts one row through the execution's
// transaction, or by bare loops that receive (up to 10 at a time), insert
// each row in a transaction of its own and delete the batch after the
// commits. Every round drains two backlogs back to back, in alternating
// order; it reports both rates and their ratio. goaws is slow (every call
// scans its queues under one lock), so the ratio says more than the rates.
func BenchmarkConsumer(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 500)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 8)
	variant := func(name string, drain func(bd *testBundle, tb testing.TB, workers int)) oncetest.Variant {
		return oncetest.Variant{Name: name, Drain: func(b *testing.B, _ int) time.Duration {
			bd := setup(b, setupOpts{visibility: 60})
			bd.publishBacklog(b, messages)
			b.StartTimer()
			began := time.Now()
			drain(bd, b, workers)
			took := time.Since(began)
			b.StopTimer()
			if n := bd.effectRows(b); n != messages {
				b.Fatalf("%s: %d rows for %d messages", name, n, messages)
			}
			return took
		}}
	}
	oncetest.CompareRates(b, messages, variant("bare", (*testBundle).drainBare), variant("oncesqs", (*testBundle).drainConsumer))
}

// publishBacklog sends n messages with keys of their own, 10 at a time.
func (b *testBundle) publishBacklog(tb testing.TB, n int) {
	tb.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := b.client.SendMessage(b.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(b.queue),
				MessageBody: aws.String(`{"amount":` + strconv.Itoa(i+1) + `}`),
				MessageAttributes: map[string]types.MessageAttributeValue{
					oncesqs.DefaultKeyAttribute: {DataType: aws.String("String"), StringValue: aws.String("order-" + strconv.Itoa(i))},
				}})
			if err != nil {
				tb.Errorf("send: %v", err)
			}
		})
	}
	wg.Wait()
}

func (b *testBundle) effectRows(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// drainConsumer drains the backlog with a Consumer.
func (b *testBundle) drainConsumer(tb testing.TB, workers int) {
	opts := b.options()
	opts.Settled = nil
	opts.Registerer = nil
	opts.Workers = workers
	opts.Receivers = max(1, workers/10)
	c, err := oncesqs.NewConsumer(b.engine, effect, opts)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	defer c.Stop()
	b.awaitDrained(tb)
}

// drainBare drains the backlog with bare receive-insert-delete loops, one
// per up to 10 workers' worth of messages.
func (b *testBundle) drainBare(tb testing.TB, workers int) {
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range max(1, workers/10) {
		wg.Go(func() {
			for ctx.Err() == nil {
				out, err := b.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(b.queue),
					MaxNumberOfMessages: int32(min(workers, 10)), //nolint:gosec // at most 10
					WaitTimeSeconds:     1, MessageAttributeNames: []string{"All"}})
				if err != nil {
					continue
				}
				var (
					ins     sync.WaitGroup
					entries = make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
				)
				for i, m := range out.Messages {
					entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					ins.Go(func() {
						key := aws.ToString(m.MessageAttributes[oncesqs.DefaultKeyAttribute].StringValue)
						tx, err := b.pool.Begin(ctx)
						if err != nil {
							return
						}
						defer func() { _ = tx.Rollback(ctx) }()
						if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ('tenant', $1, $2)`, key, aws.ToString(m.Body)); err == nil {
							_ = tx.Commit(ctx)
						}
					})
				}
				ins.Wait()
				if len(entries) > 0 {
					_, _ = b.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(b.queue), Entries: entries})
				}
			}
		})
	}
	b.awaitDrained(tb)
	cancel()
	wg.Wait()
}

// awaitDrained waits until the queue is empty.
func (b *testBundle) awaitDrained(tb testing.TB) {
	oncetest.Eventually(tb, 5*time.Minute, "the backlog drained", func() bool { return b.queued(tb, b.queue) == 0 })
}
