package oncenats_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkConsumer measures what the exactly-once consumer costs against
// a bare one on the same server: a backlog of BENCH_MESSAGES (default
// 2000) messages, each with a key of its own, drained by BENCH_WORKERS
// (default 8) workers, by one of:
//
//   - bare: a loop that inserts each message's row in a transaction of
//     its own and acks (DoubleAck) after its commit;
//   - bare_batched: a loop that takes up to BENCH_BATCH (default
//     DefaultBatchSize) messages
//     (DefaultBatchLinger after the first at most), inserts their rows in
//     one transaction (one round trip for all) and acks them all after
//     its commit;
//   - oncenats_single: a Consumer whose handler inserts one row through
//     the execution's transaction, each message alone (BatchSize 1);
//   - oncenats: the same Consumer in batches of BENCH_BATCH (default
//     DefaultBatchSize) messages, DefaultBatchLinger.
//
// Every round drains the four backlogs back to back, in rotating order,
// so all see the same machine; it reports every rate and its ratio to
// bare's (oncenats against bare_batched is the ratio of their rates).
func BenchmarkConsumer(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 8)
	batch := oncetest.EnvInt(b, "BENCH_BATCH", oncenats.DefaultBatchSize)
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
	oncetest.CompareRates(b, messages,
		variant("bare", func(bd *testBundle, tb testing.TB, workers int) { bd.drainBare(tb, workers, 1) }),
		variant("bare_batched", func(bd *testBundle, tb testing.TB, workers int) {
			bd.drainBare(tb, workers, batch)
		}),
		variant("oncenats_single", func(bd *testBundle, tb testing.TB, workers int) { bd.drainConsumer(tb, workers, 1) }),
		variant("oncenats", func(bd *testBundle, tb testing.TB, workers int) { bd.drainConsumer(tb, workers, batch) }))
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

// drainConsumer runs a Consumer (batches of batchSize) until the backlog
// is settled.
func (b *testBundle) drainConsumer(tb testing.TB, workers, batchSize int) {
	tb.Helper()
	opts := b.options()
	opts.Workers, opts.BatchSize = workers, batchSize
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

// drainBare consumes the backlog the plain way: insert the rows of up to
// batchSize messages (DefaultBatchLinger after the first at most) in one
// transaction, then ack them once it committed.
func (b *testBundle) drainBare(tb testing.TB, workers, batchSize int) {
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
	}, jetstream.PullMaxMessages(workers*batchSize))
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
					if err := b.insertAndAck(ctx, consume.Collect(msg, work, batchSize, oncenats.DefaultBatchLinger, ctx.Done())); err != nil {
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

// insertAndAck inserts the rows of msgs — alone, or in one transaction
// (one round trip for them all) — and acks them, all at once, once that
// committed.
func (b *testBundle) insertAndAck(ctx context.Context, msgs []jetstream.Msg) error {
	insert := func(db interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}, msg jetstream.Msg) error {
		_, err := db.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`,
			"tenant", msg.Headers().Get(oncenats.DefaultKeyHeader), string(msg.Data()))
		return err
	}
	var err error
	if len(msgs) == 1 {
		err = insert(b.pool, msgs[0])
	} else {
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			batch := &pgx.Batch{}
			for _, msg := range msgs {
				batch.Queue(`INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`,
					"tenant", msg.Headers().Get(oncenats.DefaultKeyHeader), string(msg.Data()))
			}
			return tx.SendBatch(ctx, batch).Close()
		})
	}
	if err != nil {
		return err
	}
	var (
		acks   sync.WaitGroup
		failed atomic.Value
	)
	for _, msg := range msgs {
		acks.Go(func() {
			if err := msg.DoubleAck(ctx); err != nil {
				failed.Store(err)
			} else if b.onAck != nil {
				b.onAck(msg)
			}
		})
	}
	acks.Wait()
	if err, ok := failed.Load().(error); ok {
		return err
	}
	return nil
}

// awaitDrained waits until the consumer has no message pending or
// unacknowledged (once b.published is closed, when set).
func (b *testBundle) awaitDrained(tb testing.TB) {
	tb.Helper()
	if b.published != nil {
		<-b.published
	}
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

// BenchmarkSettleLatency measures how long a message waits, from its
// publication to its ack, at a steady BENCH_RATE (default 1000) messages
// a second for BENCH_MESSAGES (default 2000) messages, BENCH_WORKERS
// (default 8) workers: the bare per-message loop (insert, commit, ack)
// against the package in batches (its defaults). The first tenth of the
// messages warm the connections up (their prepared statements, the lock
// secret) and are not counted, for either. Each round runs both, in
// alternating order; it reports each one's p50 and p99 and the ratio of
// the p99s.
func BenchmarkSettleLatency(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	workers := oncetest.EnvInt(b, "BENCH_WORKERS", 8)
	rate := oncetest.EnvInt(b, "BENCH_RATE", 1000)
	var bare, batched []time.Duration
	run := func(drain func(bd *testBundle, tb testing.TB, workers int, acked func(jetstream.Msg))) []time.Duration {
		bd := setup(b, setupOpts{ackWait: 30 * time.Second})
		var (
			mu  sync.Mutex
			lat = make([]time.Duration, 0, messages)
		)
		acked := func(msg jetstream.Msg) {
			sent, err := time.Parse(time.RFC3339Nano, msg.Headers().Get("Sent-At"))
			if err != nil {
				return
			}
			mu.Lock()
			lat = append(lat, time.Since(sent))
			mu.Unlock()
		}
		bd.published = make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			drain(bd, b, workers, acked)
		}()
		bd.publishPaced(b, messages, rate)
		close(bd.published)
		<-done
		return lat
	}
	for i := range b.N {
		first, second := &bare, &batched
		drainFirst, drainSecond := (*testBundle).drainBareAcked, (*testBundle).drainConsumerAcked
		if i%2 == 1 {
			first, second = second, first
			drainFirst, drainSecond = drainSecond, drainFirst
		}
		*first = append(*first, run(drainFirst)...)
		*second = append(*second, run(drainSecond)...)
	}
	q := func(lat []time.Duration, p float64) time.Duration {
		slices.Sort(lat)
		return lat[min(len(lat)-1, int(float64(len(lat))*p))]
	}
	b.ReportMetric(float64(q(bare, 0.5).Microseconds())/1000, "p50_ms_bare")
	b.ReportMetric(float64(q(bare, 0.99).Microseconds())/1000, "p99_ms_bare")
	b.ReportMetric(float64(q(batched, 0.5).Microseconds())/1000, "p50_ms_oncenats")
	b.ReportMetric(float64(q(batched, 0.99).Microseconds())/1000, "p99_ms_oncenats")
	b.ReportMetric(float64(q(batched, 0.99))/float64(q(bare, 0.99)), "p99_oncenats/bare")
	b.Logf("%d msg/s: bare p50 %v p99 %v; oncenats p50 %v p99 %v", rate, q(bare, 0.5), q(bare, 0.99), q(batched, 0.5), q(batched, 0.99))
}

// publishPaced publishes n keyed messages at rate a second, each past the
// first tenth with its time of publication (Sent-At).
func (b *testBundle) publishPaced(tb testing.TB, n, rate int) {
	tb.Helper()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		msg := &nats.Msg{Subject: b.topo.Subject, Header: nats.Header{}, Data: []byte(`{"amount":` + strconv.Itoa(i+1) + `}`)}
		msg.Header.Set(oncenats.DefaultKeyHeader, "order-"+strconv.Itoa(i))
		if i >= n/10 { // the rest warm up
			msg.Header.Set("Sent-At", time.Now().Format(time.RFC3339Nano))
		}
		if _, err := b.js.PublishMsgAsync(msg); err != nil {
			tb.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		tb.Fatal("publish: no acknowledgement after 10s")
	}
}

// drainBareAcked is drainBare, one message per transaction, calling acked
// after each ack.
func (b *testBundle) drainBareAcked(tb testing.TB, workers int, acked func(jetstream.Msg)) {
	b.onAck = acked
	b.drainBare(tb, workers, 1)
}

// drainConsumerAcked runs a Consumer with its defaults, calling acked
// after each ack, until the backlog is settled.
func (b *testBundle) drainConsumerAcked(tb testing.TB, workers int, acked func(jetstream.Msg)) {
	tb.Helper()
	opts := b.options()
	opts.Workers, opts.Registerer = workers, nil
	opts.Settled = func(msg jetstream.Msg, _ onceonly.Settlement) { acked(msg) }
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
