package oncewatermill_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncewatermill"
)

// A router that books each order once, on watermill-sql's Postgres
// pub/sub: the engine joins the subscriber's transaction, so the booking,
// the key and the consumed offset commit together. The publisher sends
// order-1 twice (two UUIDs, one idempotency_key: a retry after a lost
// answer) and then reuses the key for another order. The first copy books
// and produces a receipt; the second is a replay that produces the same
// receipt again (same UUID); the reused key goes to the poison queue.
//
// The servers come from the environment, as a service reads them from its
// configuration: DATABASE_URL and REDIS_URL.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bookings (order_id text NOT NULL, body jsonb NOT NULL)`); err != nil {
		panic(err)
	}
	redisOpts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(redisOpts)
	defer rdb.Close()
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: exampleLogger()})
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	if err := engine.Start(ctx); err != nil { // the relay, the reconciler, the resumer
		panic(err)
	}

	// watermill-sql on the engine's database: it must be the same one
	// for the key to commit with the subscriber's transaction.
	logger := watermill.NewSlogLogger(exampleLogger())
	db := wsql.BeginnerFromPgx(pool)
	publisher, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, logger)
	if err != nil {
		panic(err)
	}
	subscriber, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: 50 * time.Millisecond,
	}, logger)
	if err != nil {
		panic(err)
	}
	// A service uses fixed topics ("orders"); the example's own keep runs apart.
	run := strings.ToLower(rand.Text()[:8])
	orders, receipts, poisonTopic := "orders_"+run, "receipts_"+run, "orders_poison_"+run

	settled := make(chan string, 8)
	once, err := oncewatermill.NewMiddleware(engine, oncewatermill.Options{
		Settled: func(msg *message.Message, s onceonly.Settlement) {
			settled <- fmt.Sprintf("%s: %s %s", msg.Metadata.Get(oncewatermill.DefaultKeyMetadata), s.Disposition, s.Reason)
		},
		Logger: exampleLogger(),
	})
	if err != nil {
		panic(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(publisher, poisonTopic, oncewatermill.IsDeadLetter)
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(poison, once)
	router.AddHandler("book_order", orders, subscriber, receipts, publisher, func(msg *message.Message) ([]*message.Message, error) {
		msgCtx := msg.Context()
		orderID := msg.Metadata.Get(oncewatermill.DefaultKeyMetadata)
		fmt.Printf("booking %s: %s\n", orderID, msg.Payload)
		// The subscriber's transaction: the booking commits with the key
		// and the consumed offset.
		tx, ok := wsql.TxFromContext(msgCtx)
		if !ok {
			return nil, errors.New("not a watermill-sql message")
		}
		if _, err := tx.ExecContext(msgCtx, `INSERT INTO bookings (order_id, body) VALUES ($1, $2)`, orderID, msg.Payload); err != nil {
			return nil, err
		}
		id, err := oncewatermill.ProducedUUID(msgCtx, 0)
		if err != nil {
			return nil, err
		}
		return message.Messages{message.NewMessage(id, []byte(`{"booked":"`+orderID+`"}`))}, nil
	})
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-router.Running()

	for _, payload := range []string{`{"sku":"tea","qty":2}`, `{"sku":"tea","qty":2}`, `{"sku":"coffee","qty":9}`} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		msg.Metadata.Set(oncewatermill.DefaultKeyMetadata, "order-1")
		if err := publisher.Publish(orders, msg); err != nil {
			panic(err)
		}
	}
	for range 3 {
		fmt.Println(strings.TrimSpace(<-settled))
	}
	got := read(ctx, db, logger, receipts, 2)
	fmt.Printf("receipts: %d, the same UUID: %v\n", len(got), got[0].UUID == got[1].UUID)
	dead := read(ctx, db, logger, poisonTopic, 1)[0]
	fmt.Printf("poisoned: %s (%s)\n", dead.Payload, dead.Metadata.Get(oncewatermill.ReasonMetadata))

	// Closing the router ends its subscriber's transaction, which commits
	// the acks with the booking and the key.
	if err := router.Close(); err != nil {
		panic(err)
	}
	if err := <-routerDone; err != nil {
		panic(err)
	}
	var bookings int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bookings WHERE order_id = 'order-1'`).Scan(&bookings); err != nil {
		panic(err)
	}
	fmt.Println("bookings of order-1:", bookings)
	// Output:
	// booking order-1: {"sku":"tea","qty":2}
	// order-1: ack
	// order-1: ack
	// order-1: dead_letter reused
	// receipts: 2, the same UUID: true
	// poisoned: {"sku":"coffee","qty":9} (reused)
	// bookings of order-1: 1
}

// read reads n messages of topic with a subscriber of its own.
func read(ctx context.Context, db wsql.Beginner, logger watermill.LoggerAdapter, topic string, n int) []*message.Message {
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		ConsumerGroup: "example_reader", InitializeSchema: true, PollInterval: 50 * time.Millisecond,
	}, logger)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		panic(err)
	}
	var got []*message.Message
	for msg := range msgs {
		msg.Ack()
		if got = append(got, msg); len(got) == n {
			break
		}
	}
	if len(got) < n {
		panic(fmt.Sprintf("%s: %d of %d messages", topic, len(got), n))
	}
	return got
}

// exampleLogger keeps the example's output to what it prints.
func exampleLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
