package oncewatermill_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/oncewatermill"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable examples DATABASE_URL and REDIS_URL of their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "oncewatermill"))
}

// pubSub is a Watermill pub/sub the tests run on: watermill-sql on the
// test's own database (pgx or database/sql), or watermill-amqp on the
// shared RabbitMQ with queue names of the test's own.
type pubSub struct {
	name string
	// joined says whether the middleware joins the subscriber's
	// transaction (watermill-sql).
	joined bool
	open   func(t testing.TB, b *testBundle) (message.Publisher, message.Subscriber)
}

var pubSubs = []pubSub{
	{name: "sql-pgx", joined: true, open: openSQLPgx},
	{name: "sql-stdlib", joined: true, open: openSQLStdlib},
	{name: "amqp", open: openAMQP},
}

// forEachPubSub runs test as a parallel subtest on each pub/sub.
func forEachPubSub(t *testing.T, test func(t *testing.T, b *testBundle)) {
	t.Parallel()
	for _, ps := range pubSubs {
		t.Run(ps.name, func(t *testing.T) {
			t.Parallel()
			test(t, setup(t, ps))
		})
	}
}

// testBundle is what a test runs on: a database of its own with an
// effects table, an engine on it and the test Redis, a pub/sub, and topic
// names of the test's own.
type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
	// elsewhere is a second engine on the same keys, two-phase from the start.
	elsewhere *onceonly.Engine
	ps        pubSub
	pub       message.Publisher
	sub       message.Subscriber
	// in is the topic the handler consumes, out the one it publishes to,
	// poison the poison queue's.
	in, out, poison string
	logger          watermill.LoggerAdapter
}

func setup(t testing.TB, ps pubSub) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), ps: ps, logger: watermill.NewSlogLogger(oncetest.QuietLogger())}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (key text NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	rdb, prefix := oncetest.Redis(t)
	cfg := onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 3 * time.Second,
		Logger: oncetest.QuietLogger(),
	}
	b.engine, err = onceonly.New(cfg)
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)
	// elsewhere is another consumer of the same keys whose executions
	// commit their claim first (two-phase): a copy then finds the key held
	// by a committed row, in flight. (A one-commit holder has no row until
	// it commits: a copy in a joined transaction waits in Postgres for it,
	// as DoTx says, instead of being nacked.)
	cfg.TwoPhase = true
	b.elsewhere, err = onceonly.New(cfg)
	require.NoError(t, err)
	t.Cleanup(b.elsewhere.Close)
	suffix := oncetest.RandomSuffix(8)
	b.in, b.out, b.poison = "orders_"+suffix, "receipts_"+suffix, "poison_"+suffix
	b.pub, b.sub = ps.open(t, b)
	return b
}

func openSQLPgx(t testing.TB, b *testBundle) (message.Publisher, message.Subscriber) {
	return openSQL(t, b, wsql.BeginnerFromPgx(b.pool))
}

func openSQLStdlib(t testing.TB, b *testBundle) (message.Publisher, message.Subscriber) {
	db := stdlib.OpenDBFromPool(b.pool)
	t.Cleanup(func() { _ = db.Close() })
	return openSQL(t, b, wsql.BeginnerFromStdSQL(db))
}

// openSQL opens watermill-sql's Postgres pub/sub (the default schema and
// offsets adapter) on db, with a short poll interval.
func openSQL(t testing.TB, b *testBundle, db wsql.Beginner) (message.Publisher, message.Subscriber) {
	t.Helper()
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
	}, b.logger)
	require.NoError(t, err)
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     20 * time.Millisecond,
		ResendInterval:   20 * time.Millisecond,
	}, b.logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
	return pub, sub
}

// openAMQP opens watermill-amqp's durable queue pub/sub (a queue per
// topic, the default exchange) on the shared RabbitMQ; the test's queues
// are deleted when it ends.
func openAMQP(t testing.TB, b *testBundle) (message.Publisher, message.Subscriber) {
	t.Helper()
	url := oncetest.AMQPURL(t)
	cfg := wamqp.NewDurableQueueConfig(url)
	pub, err := wamqp.NewPublisher(cfg, b.logger)
	require.NoError(t, err)
	sub, err := wamqp.NewSubscriber(cfg, b.logger)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = sub.Close()
		_ = pub.Close()
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			for _, q := range []string{b.in, b.out, b.poison} {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		}
	})
	return pub, sub
}

// handlerName is the router handler the tests add: the scope of its keys
// by default.
const handlerName = "orders"

// routerOptions configure startRouter.
type routerOptions struct {
	opts oncewatermill.Options
	// publisher, when set, publishes the handler's produced messages in
	// place of the bundle's.
	publisher message.Publisher
}

// settlements records the settlements of the middleware (Options.Settled).
type settlements struct {
	mu  sync.Mutex
	all []settled
	ch  chan settled
}

type settled struct {
	uuid, key string
	at        time.Time
	onceonly.Settlement
}

func (s *settlements) add(msg *message.Message, st onceonly.Settlement) {
	r := settled{uuid: msg.UUID, key: msg.Metadata.Get(oncewatermill.DefaultKeyMetadata), at: time.Now(), Settlement: st}
	s.mu.Lock()
	s.all = append(s.all, r)
	s.mu.Unlock()
	s.ch <- r
}

// next returns the next settlement, failing the test after a while.
func (s *settlements) next(t *testing.T) settled {
	t.Helper()
	select {
	case r := <-s.ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no settlement within 30s")
		return settled{}
	}
}

// startRouter runs a router with one handler that consumes the bundle's
// in topic through the poison queue (IsDeadLetter) and the middleware,
// and publishes what handle returns to the out topic. It returns the
// settlements the middleware reports; the router stops when the test
// ends.
func (b *testBundle) startRouter(t *testing.T, handle message.HandlerFunc, ro routerOptions) *settlements {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, b.logger)
	require.NoError(t, err)
	poison, err := middleware.PoisonQueueWithFilter(b.pub, b.poison, oncewatermill.IsDeadLetter)
	require.NoError(t, err)
	s := &settlements{ch: make(chan settled, 1024)}
	opts := ro.opts
	opts.Settled = s.add
	if opts.Policy == (onceonly.SettlePolicy{}) {
		opts.Policy = onceonly.SettlePolicy{MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	}
	if opts.Logger == nil {
		opts.Logger = oncetest.QuietLogger()
	}
	once, err := oncewatermill.NewMiddleware(b.engine, opts)
	require.NoError(t, err)
	router.AddMiddleware(poison, once)
	pub := ro.publisher
	if pub == nil {
		pub = b.pub
	}
	router.AddHandler(handlerName, b.in, b.sub, b.out, pub, handle)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.WithoutCancel(b.ctx)) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	}
	return s
}

// publish publishes a message with key (none when empty) and payload to
// the in topic, and returns it.
func (b *testBundle) publish(t *testing.T, key, payload string) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if key != "" {
		msg.Metadata.Set(oncewatermill.DefaultKeyMetadata, key)
	}
	require.NoError(t, b.pub.Publish(b.in, msg))
	return msg
}

// collect subscribes to topic (before anything is published there: AMQP
// drops what reaches no queue) and returns a channel of the messages that
// arrive, each acked.
func (b *testBundle) collect(t *testing.T, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	t.Cleanup(cancel)
	msgs, err := b.sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	out := make(chan *message.Message, 64)
	go func() {
		defer close(out)
		for msg := range msgs {
			msg.Ack()
			select {
			case out <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// receive returns the next message of ch, failing the test after a while.
func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "subscription closed")
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
		return nil
	}
}

// requireNone fails the test if ch delivers a message within d.
func requireNone(t *testing.T, ch <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case msg := <-ch:
		t.Fatalf("unexpected message %s %q (metadata %v)", msg.UUID, msg.Payload, msg.Metadata)
	case <-time.After(d):
	}
}

// writeEffect writes the message's effect row in the transaction that
// commits with its key: the subscriber's when the middleware joined it
// (as a watermill-sql handler writes), else the execution's.
func writeEffect(msg *message.Message) error {
	ctx := msg.Context()
	key := msg.Metadata.Get(oncewatermill.DefaultKeyMetadata)
	if tx, ok := wsql.TxFromContext(ctx); ok {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (key, payload) VALUES ($1, $2)`, key, string(msg.Payload))
		return err
	}
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (key, payload) VALUES ($1, $2)`, key, string(msg.Payload))
	return err
}

// effects returns how many effect rows key has.
func (b *testBundle) effects(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n))
	return n
}

// awaitOneEffect waits until key has one effect row. A joined
// transaction commits after the settlement: when the subscriber has acked
// the message (watermill-sql: at the end of its batch).
func (b *testBundle) awaitOneEffect(t *testing.T, key string) {
	t.Helper()
	oncetest.Eventually(t, 10*time.Second, "one effect row of "+key, func() bool { return b.effects(t, key) == 1 })
}

// runs counts the handler's runs per key.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) add(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[key]++
	return r.n[key]
}

func (r *runs) get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

// failingPublisher is a real publisher that fails some of its Publish
// calls after sending the first message of the batch: a process that
// died between the key's commit and the end of the publish.
type failingPublisher struct {
	message.Publisher
	fails atomic.Int32 // calls left to fail
	calls atomic.Int32
}

var errPublish = errors.New("test: the publisher failed after the first message")

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls.Add(1)
	if p.fails.Add(-1) < 0 {
		return p.Publisher.Publish(topic, msgs...)
	}
	if len(msgs) > 0 {
		if err := p.Publisher.Publish(topic, msgs[0]); err != nil {
			return err
		}
	}
	return errPublish
}
