package oncenats_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkConsumer measures what the exactly-once consumer costs against
// a bare one on the same server: a backlog of BENCH_MESSAGES (default
// 2000) messages, each with a key of its own, drained by BENCH_WORKERS
// (default 8) workers, either by a Consumer whose handler inserts one row
// through the execution's transaction, or by a bare loop that inserts the
// row in a transaction of its own and acks (DoubleAck) after its commit.
// Every round drains two backlogs back to back, in alternating order, so
// both see the same machine; it reports both rates and their ratio.
func BenchmarkConsumer(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 8)
	variant := func(name string, drain func(bd *testBundle, tb testing.TB, workers int)) oncetest.Variant {
		return oncetest.Variant{Name: name, Drain: func(b *testing.B, _ int) time.Duration {
			bd := setup(b, setupOpts{ackWait: 30 * time.Second})
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
	oncetest.CompareRates(b, messages, variant("bare", (*testBundle).drainBare), variant("oncenats", (*testBundle).drainConsumer))
}

// publishBacklog publishes n messages with keys of their own and waits
// for the server's acknowledgements.
func (b *testBundle) publishBacklog(tb testing.TB, n int) {
	tb.Helper()
	acks := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		msg := &nats.Msg{Subject: b.topo.Subject, Header: nats.Header{}, Data: []byte(`{"amount":` + strconv.Itoa(i+1) + `}`)}
		msg.Header.Set(oncenats.DefaultKeyHeader, "order-"+strconv.Itoa(i))
		ack, err := b.js.PublishMsgAsync(msg)
		if err != nil {
			tb.Fatalf("publish: %v", err)
		}
		acks = append(acks, ack)
	}
	for _, ack := range acks {
		select {
		case <-ack.Ok():
		case err := <-ack.Err():
			tb.Fatalf("publish: %v", err)
		case <-time.After(10 * time.Second):
			tb.Fatal("publish: no acknowledgement after 10s")
		}
	}
}

// drainConsumer runs a Consumer until the backlog is settled.
func (b *testBundle) drainConsumer(tb testing.TB, workers int) {
	tb.Helper()
	opts := b.options()
	opts.Workers = workers
	opts.Registerer = nil
	c, err := oncenats.NewConsumer(b.engine, effect, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		tb.Fatal(err)
	}
	defer c.Stop()
	b.awaitDrained(tb)
}

// drainBare consumes the backlog the plain way: insert the row in a
// transaction, then ack once it committed.
func (b *testBundle) drainBare(tb testing.TB, workers int) {
	tb.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var (
		work   = make(chan jetstream.Msg)
		wg     sync.WaitGroup
		failed atomic.Value
	)
	cc, err := b.cons.Consume(func(msg jetstream.Msg) {
		select {
		case work <- msg:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(workers))
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.Stop()
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case msg := <-work:
					_, err := b.pool.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`,
						"tenant", msg.Headers().Get(oncenats.DefaultKeyHeader), string(msg.Data()))
					if err == nil {
						err = msg.DoubleAck(ctx)
					}
					if err != nil {
						failed.Store(err)
					}
				}
			}
		})
	}
	b.awaitDrained(tb)
	cancel()
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		tb.Fatalf("bare consumer: %v", err)
	}
}

// awaitDrained waits until the consumer has no message pending or
// unacknowledged.
func (b *testBundle) awaitDrained(tb testing.TB) {
	tb.Helper()
	oncetest.Eventually(tb, 5*time.Minute, "the backlog drained", func() bool {
		ci, err := b.cons.Info(b.ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

// effectRows counts the effects rows.
func (b *testBundle) effectRows(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}
