package oncenats_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil { // onceonly's tables
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, body text)`); err != nil {
		panic(err)
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, Logger: slog.New(slog.DiscardHandler),
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
	nc, err := nats.Connect(os.Getenv("NATS_URL"), nats.MaxReconnects(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	topo := oncenats.Topology{
		Stream: "ORDERS", Subject: "orders.placed", DeadLetterSubject: "orders.dead",
		Consumer: "orders", AckWait: 30 * time.Second,
	}
	cons, err := topo.Declare(ctx, js)
	if err != nil {
		panic(err)
	}

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
