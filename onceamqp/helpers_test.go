package onceamqp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncetest"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable examples what a service reads: DATABASE_URL and
// REDIS_URL of their own, and AMQP_URL (the test RabbitMQ).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "onceamqp"))
}

// testBundle is what a test runs on: a database of its own with an
// effects table, an engine on it and the test Redis, and a queue, its
// dead-letter exchange and dead-letter queue on the shared RabbitMQ, named
// for the test alone.
type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
	url    string
	queue  onceamqp.Queue
	reg    *prometheus.Registry
	// conn is the test's own connection: publishing and inspecting.
	conn *amqp.Connection
}

func setup(t testing.TB, configure ...func(*onceonly.Config)) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), url: oncetest.AMQPURL(t), reg: prometheus.NewRegistry()}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (key text NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	rdb, prefix := oncetest.Redis(t)
	cfg := onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 3 * time.Second,
		ResumeInterval: 100 * time.Millisecond, Logger: oncetest.QuietLogger(),
	}
	for _, f := range configure {
		f(&cfg)
	}
	b.engine, err = onceonly.New(cfg)
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)

	b.conn, err = amqp.Dial(b.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.conn.Close() })
	name := "onceamqp-test." + oncetest.RandomSuffix(10)
	b.queue = onceamqp.Queue{Name: name, DeadLetterExchange: name + ".dead", DeadLetterQueue: name + ".dead"}
	b.declare(t, b.queue)
	return b
}

// declare declares q on the test's connection; it is deleted when the test
// ends.
func (b *testBundle) declare(t testing.TB, q onceamqp.Queue) {
	t.Helper()
	require.NoError(t, onceamqp.DeclareQueue(b.conn, q))
	t.Cleanup(func() {
		// On a channel of its own: the test's may be closed by then.
		ch, err := b.conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q.Name, false, false, false)
		_, _ = ch.QueueDelete(q.DeadLetterQueue, false, false, false)
		_ = ch.ExchangeDelete(q.DeadLetterExchange, false, false)
	})
}

// channel opens a channel on the test's connection.
func (b *testBundle) channel(t testing.TB) *amqp.Channel {
	t.Helper()
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// options are a consumer's options for the test's queue: scope "test",
// short backoffs, the test's registry, no logs.
func (b *testBundle) options(opts onceamqp.Options) onceamqp.Options {
	opts.URL = b.url
	opts.Queue = b.queue.Name
	if opts.Scope == "" && opts.ScopeOf == nil {
		opts.Scope = "test"
	}
	if opts.Policy == (onceonly.SettlePolicy{}) {
		opts.Policy = onceonly.SettlePolicy{MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	}
	opts.Registerer = b.reg
	if opts.Logger == nil {
		opts.Logger = oncetest.QuietLogger()
	}
	return opts
}

// start starts a consumer running fn on the test's queue; it is stopped
// when the test ends.
func (b *testBundle) start(t *testing.T, fn onceamqp.Handler, opts onceamqp.Options) *onceamqp.Consumer {
	t.Helper()
	c, err := onceamqp.NewConsumer(b.engine, fn, b.options(opts))
	require.NoError(t, err)
	return b.run(t, c)
}

// run starts c and waits until it consumes; it is stopped when the test
// ends.
func (b *testBundle) run(t *testing.T, c *onceamqp.Consumer) *onceamqp.Consumer {
	t.Helper()
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(c.Stop)
	oncetest.Eventually(t, 10*time.Second, "the consumer connected", c.Connected)
	return c
}

// recordEffect is the business write of the tests' handlers: one row per
// execution, so a second execution of a key shows as a second row.
func recordEffect(ctx context.Context, tx pgx.Tx, msg onceamqp.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, payload) VALUES ($1, $2)`, msg.Key, string(msg.Payload))
	return err
}

// writeEffect is a Handler that writes recordEffect's row through
// onceonly.Tx.
func writeEffect(ctx context.Context, msg onceamqp.Message) error {
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	return recordEffect(ctx, tx, msg)
}

// publish sends a persistent message to the test's queue through the
// default exchange and waits for the broker's confirmation. An empty id
// sends no message-id.
func (b *testBundle) publish(t testing.TB, ch *amqp.Channel, id, body string) {
	t.Helper()
	require.NoError(t, ch.Confirm(false))
	confirm, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, "", b.queue.Name, true, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), ContentType: "application/json", DeliveryMode: amqp.Persistent,
	})
	require.NoError(t, err)
	ok, err := confirm.WaitContext(b.ctx)
	require.NoError(t, err)
	require.True(t, ok, "the broker refused the message")
}

// effects returns the payloads recorded for key, in no order.
func (b *testBundle) effects(t *testing.T, key string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT payload FROM effects WHERE key = $1`, key)
	require.NoError(t, err)
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return payloads
}

// keyRows counts the key rows of the engine.
func (b *testBundle) keyRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n))
	return n
}

// ready returns how many messages are ready in queue (delivered ones not
// yet settled are not counted).
func (b *testBundle) ready(t testing.TB, queue string) int {
	t.Helper()
	ch := b.channel(t)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// deadLetter waits for the next message of the dead-letter queue and
// returns it (acknowledged).
func (b *testBundle) deadLetter(t *testing.T) amqp.Delivery {
	t.Helper()
	return next(t, b.channel(t), b.queue.DeadLetterQueue, true)
}

// next waits for the next message of queue on ch and returns it,
// acknowledged when autoAck.
func next(t *testing.T, ch *amqp.Channel, queue string, autoAck bool) amqp.Delivery {
	t.Helper()
	var d amqp.Delivery
	oncetest.Eventually(t, 10*time.Second, "a message in "+queue, func() bool {
		var ok bool
		var err error
		d, ok, err = ch.Get(queue, autoAck)
		require.NoError(t, err)
		return ok
	})
	return d
}

// requireDeath checks the x-death header RabbitMQ adds to a message the
// consumer rejected from queue.
func requireDeath(t *testing.T, d amqp.Delivery, queue string) {
	t.Helper()
	deaths, ok := d.Headers["x-death"].([]any)
	require.True(t, ok, "no x-death header in %v", d.Headers)
	require.NotEmpty(t, deaths)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	require.Equal(t, "rejected", death["reason"])
	require.Equal(t, queue, death["queue"])
}

// settled returns the value of onceonly_amqp_deliveries_total for the
// test's queue with disposition and reason ("" for every reason).
func (b *testBundle) settled(t *testing.T, disposition, reason string) int {
	t.Helper()
	want := map[string]string{"disposition": disposition}
	if reason != "" {
		want["reason"] = reason
	}
	return int(oncetest.Metric(t, b.reg, "onceonly_amqp_deliveries_total", want))
}

// awaitSettled waits until n deliveries were settled with disposition and
// reason.
func (b *testBundle) awaitSettled(t *testing.T, n int, disposition, reason string) {
	t.Helper()
	oncetest.Eventually(t, 20*time.Second, disposition+" "+reason, func() bool {
		return b.settled(t, disposition, reason) >= n
	})
}

// attempts records when a handler ran for each key.
type attempts struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (a *attempts) add(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at == nil {
		a.at = make(map[string][]time.Time)
	}
	a.at[key] = append(a.at[key], time.Now())
	return len(a.at[key])
}

func (a *attempts) of(key string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at[key]...)
}
