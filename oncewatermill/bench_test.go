package oncewatermill_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/oncewatermill"
)

// BenchmarkRouter measures messages per second through a router with the
// middleware against the same router without it, on watermill-sql's
// Postgres queue (PostgreSQLQueueSchema, rows deleted on ack, one
// subscriber, batches of 100 in one transaction). The handler of both
// writes one row through the subscriber's transaction (TxFromContext);
// with the middleware, the key's claim and completion join that
// transaction (Engine.DoTx), behind the Redis check. Every round drains a
// backlog of BENCH_MESSAGES (default 2000) messages, each with a key of
// its own, once per variant, in rotating order so both see the same
// machine; a message counts when the router's handler chain returned for
// it (its batch commits after). No relay runs beside the engine. It
// reports each variant's rate and the ratio.
func BenchmarkRouter(b *testing.B) {
	messages := oncetest.EnvInt(b, "BENCH_MESSAGES", 2000)
	// The rounds open their own publishers and subscribers.
	tb := setup(b, pubSub{name: "sql-queue", joined: true, open: func(testing.TB, *testBundle) (message.Publisher, message.Subscriber) {
		return nil, nil
	}})
	variant := func(name string, middleware bool) oncetest.Variant {
		return oncetest.Variant{Name: name, Drain: func(b *testing.B, i int) time.Duration {
			topic := fmt.Sprintf("bench_%d_%s", i, name)
			tb.publishBacklog(b, topic, messages)
			return tb.drain(b, topic, messages, middleware)
		}}
	}
	oncetest.CompareRates(b, messages, variant("bare", false), variant("oncewatermill", true))
}

// queueSchema is watermill-sql's Postgres queue: rows deleted on ack.
var (
	queueSchema  = wsql.PostgreSQLQueueSchema{}
	queueOffsets = wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true}
)

// publishBacklog publishes n messages with keys "<topic>.<i>" to topic, in
// one statement.
func (b *testBundle) publishBacklog(t testing.TB, topic string, n int) {
	t.Helper()
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(b.pool), wsql.PublisherConfig{SchemaAdapter: queueSchema, AutoInitializeSchema: true}, b.logger)
	require.NoError(t, err)
	defer pub.Close()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":"%s.%d","amount":%d}`, topic, i, 100+i))
		msgs[i].Metadata.Set(oncewatermill.DefaultKeyMetadata, topic+"."+strconv.Itoa(i))
	}
	require.NoError(t, pub.Publish(topic, msgs...))
}

// drain runs a router on topic until n messages went through its handler
// chain, and returns how long that took from its start.
func (b *testBundle) drain(t *testing.B, topic string, n int, once bool) time.Duration {
	db := wsql.BeginnerFromPgx(b.pool)
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: queueSchema, OffsetsAdapter: queueOffsets, InitializeSchema: true,
		PollInterval: 10 * time.Millisecond,
	}, b.logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, b.logger)
	require.NoError(t, err)
	var handled atomic.Int64
	done := make(chan struct{})
	// Outermost: a message counts once the whole chain returned for it.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && handled.Add(1) == int64(n) {
				close(done)
			}
			return out, err
		}
	})
	if once {
		pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: queueSchema, AutoInitializeSchema: true}, b.logger)
		require.NoError(t, err)
		poison, err := middleware.PoisonQueueWithFilter(pub, topic+"_poison", oncewatermill.IsDeadLetter)
		require.NoError(t, err)
		mw, err := oncewatermill.NewMiddleware(b.engine, oncewatermill.Options{Scope: "bench", Logger: oncetest.QuietLogger()})
		require.NoError(t, err)
		router.AddMiddleware(poison, mw)
	}
	router.AddConsumerHandler("bench", topic, sub, func(msg *message.Message) error {
		tx, ok := wsql.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no subscriber transaction")
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (key, payload) VALUES ($1, $2)`,
			msg.Metadata.Get(oncewatermill.DefaultKeyMetadata), string(msg.Payload))
		return err
	})
	routerDone := make(chan error, 1)
	t.StartTimer()
	began := time.Now()
	go func() { routerDone <- router.Run(context.Background()) }()
	select {
	case <-done:
	case err := <-routerDone:
		t.Fatalf("router stopped: %v", err)
	}
	took := time.Since(began)
	t.StopTimer()
	require.NoError(t, router.Close())
	require.NoError(t, <-routerDone)
	return took
}
