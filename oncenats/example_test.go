package oncenats_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncenats"
)

// An order message is published twice, and once more with the same key
// and another body: one order row, the copy acked, the reuse
// dead-lettered with its reason.
func Example() {
	// The servers scripts/test.sh starts; any Postgres, Redis and
	// nats-server with JetStream will do.
	pgURL, redisURL, natsURL := os.Getenv("TEST_DATABASE_URL"), os.Getenv("TEST_REDIS_URL"), os.Getenv("TEST_NATS_URL")
	if pgURL == "" || redisURL == "" || natsURL == "" {
		panic("set TEST_DATABASE_URL, TEST_REDIS_URL and TEST_NATS_URL (scripts/test.sh does)")
	}
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36) // names of this run's own

	// Postgres: onceonly's tables and the orders in a schema of their own.
	pool, dropSchema := openSchema(ctx, pgURL, "oncenats_example_"+run)
	defer dropSchema()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, body text)`); err != nil {
		panic(err)
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, RedisPrefix: "oncenats-example-" + run + ":",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	// The relay, the reconciler and the resumer, beside the consumer.
	if err := engine.Start(ctx); err != nil {
		panic(err)
	}

	// NATS: reconnect forever; the stream and the durable consumer.
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	topo := oncenats.Topology{
		Stream: "ORDERS_" + run, Subject: "orders." + run + ".placed", DeadLetterSubject: "orders." + run + ".dead",
		Consumer: "orders", AckWait: 30 * time.Second,
	}
	cons, err := topo.Declare(ctx, js)
	if err != nil {
		panic(err)
	}
	defer js.DeleteStream(ctx, topo.Stream) //nolint:errcheck // the example's own stream

	c, err := oncenats.NewConsumer(engine, func(ctx context.Context, msg oncenats.Message) error {
		fmt.Println("placing", msg.Key)
		tx, err := onceonly.Tx(ctx) // commits with the key
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
		return err
	}, oncenats.Options{
		JetStream: js, Stream: topo.Stream, Consumer: topo.Consumer,
		Scope: "shop", DeadLetterSubject: topo.DeadLetterSubject,
		Workers: 1, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Stop()

	for _, body := range []string{`{"sku":"book"}`, `{"sku":"book"}`, `{"sku":"lamp"}`} {
		msg := &nats.Msg{Subject: topo.Subject, Header: nats.Header{}, Data: []byte(body)}
		msg.Header.Set("Idempotency-Key", "order-1")
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			panic(err)
		}
	}
	// Wait until the consumer has settled all three.
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			panic(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		panic(err)
	}
	stream, err := js.Stream(ctx, topo.Stream)
	if err != nil {
		panic(err)
	}
	dead, err := stream.GetLastMsgForSubject(ctx, topo.DeadLetterSubject)
	if err != nil {
		panic(err)
	}
	fmt.Println("orders:", orders)
	fmt.Println("dead letter:", string(dead.Data), dead.Header.Get(oncenats.HeaderReason))
	// Output:
	// placing order-1
	// orders: 1
	// dead letter: {"sku":"lamp"} reused
}

// openSchema returns a pool whose tables live in schema (created, and
// migrated), and a function that drops the schema and closes the pool.
func openSchema(ctx context.Context, url, schema string) (*pgxpool.Pool, func()) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		panic(err)
	}
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		panic(err)
	}
	return pool, func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	}
}
