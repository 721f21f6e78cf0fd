// Command quickstart is the program of docs/getting-started.md: an HTTP
// endpoint and a NATS JetStream consumer that each run once per idempotency
// key, on Postgres (DATABASE_URL), Redis (REDIS_URL) and NATS (NATS_URL).
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncenats"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	check(err)
	_, err = migrations.Up(ctx, pool) // the engine's tables
	check(err)
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, sku text)`)
	check(err)
	redisOpts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	check(err)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: redis.NewClient(redisOpts)})
	check(err)
	check(engine.Start(ctx)) // relay, reconciler, resumer: in this process

	// A consumer: each message runs once per Idempotency-Key header, however often it comes.
	nc, err := nats.Connect(os.Getenv("NATS_URL"), nats.MaxReconnects(-1))
	check(err)
	js, err := jetstream.New(nc)
	check(err)
	topo := oncenats.Topology{Stream: "SHOP", Subject: "shop.orders", Consumer: "orders"}
	_, err = topo.Declare(ctx, js) // the stream and the durable consumer, when missing
	check(err)
	consumer, err := oncenats.NewTxConsumer(engine, func(ctx context.Context, tx pgx.Tx, msg oncenats.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (sku) VALUES ($1)`, string(msg.Payload)) // commits with the key
		return err
	}, oncenats.Options{JetStream: js, Stream: topo.Stream, Consumer: topo.Consumer, Scope: "shop_1", Workers: 1,
		Settled: func(_ jetstream.Msg, s onceonly.Settlement) {
			fmt.Println("message:", s.Disposition, "replayed:", s.Outcome.Replayed)
		}})
	check(err)
	check(consumer.Start(ctx))
	for range 2 { // a publisher retrying: the same message twice
		_, err = js.PublishMsg(ctx, &nats.Msg{Subject: topo.Subject, Header: nats.Header{"Idempotency-Key": {"msg-1"}}, Data: []byte("lamp")})
		check(err)
	}

	// An endpoint: a retry with the same Idempotency-Key gets the stored answer.
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := onceonly.Tx(r.Context()) // commits with the key
		if err == nil {
			_, err = tx.Exec(r.Context(), `INSERT INTO orders (sku) VALUES ('book')`)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	tenant := onceonly.MiddlewareOptions{Scope: func(*http.Request) (string, error) { return "shop_1", nil }}
	http.Handle("/orders", engine.Middleware(tenant)(orders))
	log.Fatal(http.ListenAndServe(os.Getenv("HTTP_ADDR"), nil)) //nolint:gosec // G114: a quickstart sets no timeouts
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
