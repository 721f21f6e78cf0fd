package oncekafka_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly/oncekafka"
	"github.com/onceonly/onceonly/oncekafka/kafkatest"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkConsumer measures what the exactly-once consumer costs against
// a bare one on the same broker and client library: a backlog of
// BENCH_MESSAGES (default 2000) records over the topic's partitions, each
// with a key of its own, drained by BENCH_WORKERS (default 8) workers,
// either by a Consumer whose handler inserts one row through the
// execution's transaction, or by a bare group member that polls, inserts
// each record's row in a transaction of its own on a worker, and commits
// the poll's offsets once its rows committed. Every round drains two
// backlogs back to back, in alternating order, so both see the same
// machine; it reports both rates and their ratio.
func BenchmarkConsumer(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 8)
	variant := func(name string, drain func(bd *testBundle, tb testing.TB, workers int)) oncetest.Variant {
		return oncetest.Variant{Name: name, Drain: func(b *testing.B, _ int) time.Duration {
			bd := setup(b, nil)
			bd.produceBacklog(b, messages)
			b.StartTimer()
			began := time.Now()
			drain(bd, b, workers)
			took := time.Since(began)
			b.StopTimer()
			if n := bd.effectRows(b); n != messages {
				b.Fatalf("%s: %d rows for %d records", name, n, messages)
			}
			return took
		}}
	}
	oncetest.CompareRates(b, messages, variant("bare", (*testBundle).drainBare), variant("oncekafka", (*testBundle).drainConsumer))
}

// produceBacklog produces n records with keys of their own.
func (b *testBundle) produceBacklog(tb testing.TB, n int) {
	tb.Helper()
	recs := make([]*kgo.Record, n)
	for i := range n {
		recs[i] = &kgo.Record{Topic: b.topic, Partition: int32(i % partitions), Value: []byte(`{"amount":` + strconv.Itoa(i+1) + `}`),
			Headers: []kgo.RecordHeader{{Key: oncekafka.DefaultKeyHeader, Value: []byte("order-" + strconv.Itoa(i))}}}
	}
	if err := b.cl.ProduceSync(b.ctx, recs...).FirstErr(); err != nil {
		tb.Fatalf("produce: %v", err)
	}
}

// drainConsumer runs a Consumer until the backlog is committed.
func (b *testBundle) drainConsumer(tb testing.TB, workers int) {
	tb.Helper()
	opts := b.options()
	opts.Workers = workers
	opts.Registerer = nil
	opts.Settled = nil
	c, err := oncekafka.NewConsumer(b.engine, effect, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		tb.Fatal(err)
	}
	defer c.Stop()
	b.awaitSettled(tb, 5*time.Minute)
}

// drainBare consumes the backlog the plain way: poll, insert each
// record's row in a transaction on a worker, commit the poll's offsets
// once all its rows committed.
func (b *testBundle) drainBare(tb testing.TB, workers int) {
	tb.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	cl, err := kgo.NewClient(append(b.options().ClientOptions,
		kgo.SeedBrokers(b.broker.Addr), kgo.ConsumerGroup(b.group), kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())...)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	var failed atomic.Value
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fetches := cl.PollRecords(ctx, 4*workers)
			recs := fetches.Records()
			var wg sync.WaitGroup
			work := make(chan *kgo.Record)
			for range workers {
				wg.Go(func() {
					for rec := range work {
						_, err := b.pool.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`,
							"tenant", kafkatest.Header(rec, oncekafka.DefaultKeyHeader), string(rec.Value))
						if err != nil && ctx.Err() == nil {
							failed.Store(err)
						}
					}
				})
			}
			for _, rec := range recs {
				work <- rec
			}
			close(work)
			wg.Wait()
			if len(recs) > 0 {
				if err := cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
					failed.Store(err)
				}
			}
		}
	}()
	b.awaitSettled(tb, 5*time.Minute)
	cancel()
	<-done
	if err, ok := failed.Load().(error); ok {
		tb.Fatalf("bare consumer: %v", err)
	}
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
