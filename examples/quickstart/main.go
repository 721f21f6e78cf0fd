// Command quickstart is the program of docs/getting-started.md: an HTTP
// endpoint and a message consumer that each run once per idempotency key,
// on Postgres (DATABASE_URL) and Redis (REDIS_URL).
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
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

	// A consumer: each delivery runs the registered handler once per key.
	check(engine.Register("refund", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		id, err := onceonly.Step(ctx, "provider", func(ctx context.Context, key string) (string, error) {
			return "re_" + key[:8], nil // call the provider with key as its idempotency key
		})
		return onceonly.Result{Body: []byte(id)}, err
	}))
	for range 2 { // the broker delivers the message twice
		out, err := engine.Run(ctx, "refund", "shop_1", "msg-1", []byte(`{"order":1}`))
		s := onceonly.Settle(out, err)
		fmt.Println("delivery:", s.Disposition, "replayed:", out.Replayed)
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
	err = http.ListenAndServe(os.Getenv("HTTP_ADDR"), nil) //nolint:gosec // G114: a quickstart sets no timeouts
	engine.Close()
	log.Fatal(err)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
