package onceamqp_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/onceamqp"
)

// A consumer of order messages that books each order once. The publisher
// sends order-1 twice (a retry after a lost confirm, say) and then reuses
// its message-id for another order: the first copy books, the second is
// acked without booking again, and the reused id is dead-lettered.
//
// The servers come from the environment, as a service reads its
// configuration: AMQP_URL, DATABASE_URL and REDIS_URL.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	engine, pool, cleanup := exampleEngine(ctx)
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bookings (order_id text NOT NULL, body jsonb NOT NULL)`); err != nil {
		panic(err)
	}
	amqpURL := os.Getenv("AMQP_URL")

	// The queue and its dead letters. A service uses fixed names
	// ("orders.book"); the example's own keep runs on one broker apart.
	name := "example.orders." + rand.Text()[:8]
	topology := onceamqp.Queue{Name: name, DeadLetterExchange: name + ".dead", DeadLetterQueue: name + ".dead"}
	defer deleteTopology(amqpURL, topology)

	settled := make(chan string, 8)
	consumer, err := onceamqp.NewConsumer(engine, func(ctx context.Context, msg onceamqp.Message) error {
		fmt.Printf("booking %s: %s\n", msg.Key, msg.Payload)
		// The business write commits with the key's completion, or not at all.
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO bookings (order_id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
		return err
	}, onceamqp.Options{
		URL:     amqpURL,
		Queue:   topology.Name,
		Declare: func(conn *amqp.Connection) error { return onceamqp.DeclareQueue(conn, topology) },
		Scope:   "orders",
		Workers: 1, // one at a time, so the example prints in order
		Settled: func(d *amqp.Delivery, s onceonly.Settlement) {
			settled <- strings.TrimSpace(fmt.Sprintf("%s: %s %s", d.MessageId, s.Disposition, s.Reason))
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := consumer.Start(ctx); err != nil {
		panic(err)
	}
	defer consumer.Stop()

	// The publisher declares the topology too, in case it starts first.
	publish := examplePublisher(ctx, amqpURL, topology)
	publish("order-1", `{"sku":"tea","qty":2}`)
	publish("order-1", `{"sku":"tea","qty":2}`)
	publish("order-1", `{"sku":"coffee","qty":9}`)
	for range 3 {
		fmt.Println(<-settled)
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
	// bookings of order-1: 1
}

// exampleEngine is what a service does at start: connect to Postgres and
// Redis (DATABASE_URL, REDIS_URL), migrate, build the engine and start its
// daemons (the relay, the reconciler, the resumer) in-process.
func exampleEngine(ctx context.Context) (*onceonly.Engine, *pgxpool.Pool, func()) {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if _, err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := engine.Start(ctx); err != nil {
		panic(err)
	}
	return engine, pool, func() { engine.Close(); _ = rdb.Close(); pool.Close() }
}

// examplePublisher declares the topology and returns a function that
// publishes a persistent message with a message-id and waits for the
// broker's confirmation.
func examplePublisher(ctx context.Context, amqpURL string, topology onceamqp.Queue) func(id, body string) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		panic(err)
	}
	context.AfterFunc(ctx, func() { _ = conn.Close() })
	if err := onceamqp.DeclareQueue(conn, topology); err != nil {
		panic(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if err := ch.Confirm(false); err != nil {
		panic(err)
	}
	return func(id, body string) {
		confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", topology.Name, true, false, amqp.Publishing{
			MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
		})
		if err != nil {
			panic(err)
		}
		if ok, err := confirm.WaitContext(ctx); err != nil || !ok {
			panic(fmt.Sprintf("publish %s: not confirmed (%v)", id, err))
		}
	}
}

// deleteTopology deletes the example's queues and exchange.
func deleteTopology(amqpURL string, topology onceamqp.Queue) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(topology.Name, false, false, false)
	_, _ = ch.QueueDelete(topology.DeadLetterQueue, false, false, false)
	_ = ch.ExchangeDelete(topology.DeadLetterExchange, false, false)
}
