package onceamqp_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkConsume measures messages per second through the consumer
// against the same broker's bare consume-and-insert loop: Workers
// goroutines on one channel with the same prefetch, each delivery a plain
// INSERT (autocommit) and then an ack. Every round drains a backlog of
// BENCH_MESSAGES (default 2000) persistent messages, each with a message-id
// of its own, from a quorum queue once per variant, in rotating order so
// all see the same machine:
//
//   - bare: the loop above, no idempotency;
//   - tx: a TxHandler (Engine.Do) writing the same row;
//   - run: a Handler (Engine.Run, the default) writing it through
//     onceonly.Tx.
//
// BENCH_WORKERS (default 4) sets the workers of each. The engine runs on
// Postgres and Redis, with its daemons (the relay, the reconciler, the
// resumer) started beside it as a consumer process runs them
// (Engine.Start). It reports each variant's rate and its ratio to bare's.
func BenchmarkConsume(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 4)
	tb := setup(b)
	require.NoError(b, tb.engine.Start(tb.ctx))
	variant := func(name string, drain func(b *testing.B, tb *testBundle, round string, messages, workers int) time.Duration) oncetest.Variant {
		return oncetest.Variant{Name: name, Drain: func(b *testing.B, i int) time.Duration {
			round := fmt.Sprintf("%d.%s", i, name)
			tb.publishBacklog(b, round, messages)
			return drain(b, tb, round, messages, workers)
		}}
	}
	oncetest.CompareRates(b, messages,
		variant("bare", drainBare), variant("tx", drainConsumer(false)), variant("run", drainConsumer(true)))
}

// publishBacklog publishes n persistent messages with message-ids
// "<round>.<i>" to the queue and waits for the broker's confirmations.
func (b *testBundle) publishBacklog(t testing.TB, round string, n int) {
	t.Helper()
	ch := b.channel(t)
	require.NoError(t, ch.Confirm(false))
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for i := range n {
		c, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, "", b.queue.Name, true, false, amqp.Publishing{
			MessageId: round + "." + strconv.Itoa(i), ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Body: fmt.Appendf(nil, `{"order":"%s.%d","amount":%d,"currency":"eur","customer":"cus_%08d"}`, round, i, 100+i, i),
		})
		require.NoError(t, err)
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		ok, err := c.WaitContext(b.ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	require.NoError(t, ch.Close())
}

// drainBare consumes n messages with the bare loop and returns how long it
// took from the start of consuming to the last ack.
func drainBare(b *testing.B, tb *testBundle, _ string, n, workers int) time.Duration {
	conn, err := amqp.Dial(tb.url)
	require.NoError(b, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Qos(2*workers, 0, false))
	b.StartTimer()
	began := time.Now()
	deliveries, err := ch.Consume(tb.queue.Name, "", false, false, false, false, nil)
	require.NoError(b, err)
	var acked atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range deliveries {
				_, err := tb.pool.Exec(tb.ctx, `INSERT INTO effects (key, payload) VALUES ($1, $2)`, d.MessageId, string(d.Body))
				if err != nil {
					b.Error(err)
					_ = d.Nack(false, true)
					continue
				}
				if err := d.Ack(false); err != nil {
					b.Error(err)
				}
				if acked.Add(1) == int64(n) {
					close(done)
				}
			}
		})
	}
	<-done
	took := time.Since(began)
	b.StopTimer()
	require.NoError(b, ch.Close())
	wg.Wait()
	return took
}

// drainConsumer returns a variant that consumes n messages with an
// onceamqp consumer, through Engine.Run (run) or Engine.Do.
func drainConsumer(run bool) func(b *testing.B, tb *testBundle, round string, n, workers int) time.Duration {
	return func(b *testing.B, tb *testBundle, round string, n, workers int) time.Duration {
		var acked atomic.Int64
		done := make(chan struct{})
		opts := tb.options(onceamqp.Options{
			Workers: workers,
			Name:    "bench." + round,
			Settled: func(_ *amqp.Delivery, s onceonly.Settlement) {
				if s.Disposition != onceonly.Ack {
					b.Errorf("a delivery was settled %s: %v", s.Disposition, s.Err)
					return
				}
				if acked.Add(1) == int64(n) {
					close(done)
				}
			},
		})
		opts.Registerer = nil
		var c *onceamqp.Consumer
		var err error
		if run {
			c, err = onceamqp.NewConsumer(tb.engine, writeEffect, opts)
		} else {
			c, err = onceamqp.NewTxConsumer(tb.engine, recordEffect, opts)
		}
		require.NoError(b, err)
		b.StartTimer()
		began := time.Now()
		require.NoError(b, c.Start(context.Background()))
		<-done
		took := time.Since(began)
		b.StopTimer()
		c.Stop()
		return took
	}
}
