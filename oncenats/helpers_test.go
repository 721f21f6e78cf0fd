package oncenats_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable example DATABASE_URL, REDIS_URL and NATS_URL.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "oncenats"))
}

// leaseTimeout is the engine's lease in these tests.
const leaseTimeout = 2 * time.Second

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
	nc     *nats.Conn
	js     jetstream.JetStream
	topo   oncenats.Topology
	cons   jetstream.Consumer
	reg    *prometheus.Registry

	mu      sync.Mutex
	settled []onceonly.Settlement // every settlement of the consumers options() made

	// The benchmarks': published, when set, is closed once every message
	// is published; onAck is called after each ack of a bare loop.
	published chan struct{}
	onAck     func(jetstream.Msg)
}

// setupOpts vary setup.
type setupOpts struct {
	natsURL string        // default: the shared test server (oncetest.NATSURL)
	ackWait time.Duration // default 2s
	lease   time.Duration // the engine's; default leaseTimeout
}

// setup gives a test a database with an effects table, an engine on it
// and the test Redis, and a stream, subjects and a durable consumer of its
// own on the NATS server.
func setup(t testing.TB, opts setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), reg: prometheus.NewRegistry()}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (scope text NOT NULL, key text NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	rdb, prefix := oncetest.Redis(t)
	lease := opts.lease
	if lease == 0 {
		lease = leaseTimeout
	}
	b.engine, err = onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: lease,
		ResumeInterval: 100 * time.Millisecond, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)

	url := opts.natsURL
	if url == "" {
		url = oncetest.NATSURL(t)
	}
	b.nc, err = nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(b.nc.Close)
	b.js, err = jetstream.New(b.nc)
	require.NoError(t, err)
	sfx := oncetest.RandomSuffix(10)
	b.topo = oncenats.Topology{
		Stream:            "T_" + sfx,
		Subject:           "t." + sfx + ".charge",
		DeadLetterSubject: "t." + sfx + ".dead",
		Consumer:          "c_" + sfx,
		AckWait:           opts.ackWait,
	}
	if b.topo.AckWait == 0 {
		b.topo.AckWait = 2 * time.Second
	}
	b.cons, err = b.topo.Declare(b.ctx, b.js)
	require.NoError(t, err)
	if opts.natsURL == "" {
		// The shared server keeps what a test declared: delete it. A
		// private server ends with the test (its context) and takes its
		// streams along.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := b.js.DeleteStream(ctx, b.topo.Stream); err != nil {
				t.Errorf("delete stream %s: %v", b.topo.Stream, err)
			}
		})
	}
	return b
}

// options returns consumer options on the bundle's server and consumer.
func (b *testBundle) options() oncenats.Options {
	return oncenats.Options{
		JetStream:         b.js,
		Stream:            b.topo.Stream,
		Consumer:          b.topo.Consumer,
		Scope:             "tenant",
		DeadLetterSubject: b.topo.DeadLetterSubject,
		Policy:            onceonly.SettlePolicy{MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Workers:           4,
		LeaseTimeout:      leaseTimeout,
		Logger:            oncetest.QuietLogger(),
		Registerer:        b.reg,
		Settled: func(_ jetstream.Msg, s onceonly.Settlement) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.settled = append(b.settled, s)
		},
	}
}

// retries returns the delays of the settlements that gave a message back
// for a later delivery, in order.
func (b *testBundle) retries() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var after []time.Duration
	for _, s := range b.settled {
		if s.Disposition == onceonly.Retry {
			after = append(after, s.After)
		}
	}
	return after
}

// run creates a consumer running fn with opts and runs it until the test
// ends (or stop is called); the test fails if Run returns an error.
func (b *testBundle) run(t testing.TB, fn oncenats.Handler, opts oncenats.Options) (stop func()) {
	t.Helper()
	c, err := oncenats.NewConsumer(b.engine, fn, opts)
	require.NoError(t, err)
	return b.runConsumer(t, c)
}

func (b *testBundle) runConsumer(t testing.TB, c *oncenats.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(15 * time.Second):
				t.Error("Run did not return within 15s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// publish publishes body with the key in the Idempotency-Key header (none
// when key is "").
func (b *testBundle) publish(t testing.TB, key, body string) {
	t.Helper()
	msg := &nats.Msg{Subject: b.topo.Subject, Header: nats.Header{}, Data: []byte(body)}
	if key != "" {
		msg.Header.Set(oncenats.DefaultKeyHeader, key)
	}
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

// effect is a handler that writes one effects row through the execution's
// transaction.
func effect(ctx context.Context, msg oncenats.Message) error {
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`, msg.Scope, msg.Key, string(msg.Payload))
	return err
}

// effectAfter returns a handler that waits until release is closed (or
// its context ends), then writes the effect.
func effectAfter(release <-chan struct{}) oncenats.Handler {
	return func(ctx context.Context, msg oncenats.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, msg)
	}
}

// rows counts the effects rows of key.
func (b *testBundle) rows(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n))
	return n
}

// keyRows counts the idempotency_keys rows of the test's database.
func (b *testBundle) keyRows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n))
	return n
}

// info returns the consumer's state on the server.
func (b *testBundle) info(t testing.TB) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := b.cons.Info(b.ctx)
	require.NoError(t, err)
	return ci
}

// awaitSettled waits until every message published was delivered and
// settled: none pending delivery, none waiting for an ack.
func (b *testBundle) awaitSettled(t testing.TB, timeout time.Duration) {
	t.Helper()
	oncetest.Eventually(t, timeout, "every message settled", func() bool {
		ci, err := b.cons.Info(b.ctx)
		if err != nil {
			return false // the server may be restarting
		}
		return ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

// deadLetters returns the copies on the dead-letter subject.
func (b *testBundle) deadLetters(t testing.TB) []jetstream.Msg {
	t.Helper()
	stream, err := b.js.Stream(b.ctx, b.topo.Stream)
	require.NoError(t, err)
	oc, err := stream.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{b.topo.DeadLetterSubject}})
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for {
		batch, err := oc.FetchNoWait(100)
		require.NoError(t, err)
		n := 0
		for msg := range batch.Messages() {
			msgs = append(msgs, msg)
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			require.NoError(t, err)
		}
		if n == 0 {
			return msgs
		}
	}
}

// awaitDeadLetters waits until n copies are on the dead-letter subject and
// returns them.
func (b *testBundle) awaitDeadLetters(t testing.TB, n int) []jetstream.Msg {
	t.Helper()
	var msgs []jetstream.Msg
	oncetest.Eventually(t, 10*time.Second, "dead letters", func() bool {
		msgs = b.deadLetters(t)
		return len(msgs) >= n
	})
	require.Len(t, msgs, n)
	return msgs
}

// count reads onceonly_nats_messages_total{disposition, reason}.
func (b *testBundle) count(t testing.TB, disposition, reason string) int {
	t.Helper()
	return int(oncetest.Metric(t, b.reg, "onceonly_nats_messages_total", map[string]string{"disposition": disposition, "reason": reason}))
}
