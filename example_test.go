package onceonly_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
)

// exampleEngine is what a service does at start: connect to Postgres and
// Redis (DATABASE_URL, REDIS_URL), migrate, build the engine and start its
// daemons (the relay, the reconciler, the resumer) in-process.
func exampleEngine(ctx context.Context) (*onceonly.Engine, func()) {
	return exampleEngineWith(ctx, nil)
}

// exampleEngineWith is exampleEngine with db, when not nil, as the
// engine's Config.DB.
func exampleEngineWith(ctx context.Context, db *sql.DB) (*onceonly.Engine, func()) {
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
	engine, err := onceonly.New(onceonly.Config{Pool: pool, DB: db, Redis: rdb})
	if err != nil {
		panic(err)
	}
	if err := engine.Start(ctx); err != nil {
		panic(err)
	}
	return engine, func() { engine.Close(); _ = rdb.Close(); pool.Close() }
}

// A message consumer: the message ID is the idempotency key. A redelivery
// gets the stored result and the handler does not run again.
func ExampleEngine_Do() {
	ctx := context.Background()
	engine, cleanup := exampleEngine(ctx)
	defer cleanup()

	handle := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		// Business writes go through tx and commit with the key's completion.
		var n int
		if err := tx.QueryRow(ctx, `SELECT 42`).Scan(&n); err != nil {
			return onceonly.Result{}, err
		}
		fmt.Println("charging the card")
		return onceonly.Result{Status: 200, Body: []byte(strconv.Itoa(n))}, nil
	}
	for range 2 { // the broker delivers the message twice
		out, err := engine.Do(ctx, "billing", "msg-0001", []byte(`{"amount":1000}`), handle)
		if err != nil {
			panic(err)
		}
		fmt.Printf("status=%d body=%s replayed=%v\n", out.Status, out.Body, out.Replayed)
	}
	// Output:
	// charging the card
	// status=200 body=42 replayed=false
	// status=200 body=42 replayed=true
}

// An HTTP service: the middleware wraps a handler that writes through
// onceonly.Tx; a retry with the same Idempotency-Key is replayed.
func ExampleEngine_Middleware() {
	engine, cleanup := exampleEngine(context.Background())
	defer cleanup()

	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := onceonly.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = tx.Exec(r.Context(), `SELECT 1`) // the business write
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":"ord_1"}`)
	})
	srv := httptest.NewServer(engine.Middleware(onceonly.MiddlewareOptions{
		Scope: func(r *http.Request) (string, error) { return "tenant_1", nil },
	})(create))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"x"}`))
		req.Header.Set("Idempotency-Key", "order-42")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(body))
	}
	// Output:
	// 201  {"order":"ord_1"}
	// 201 true {"order":"ord_1"}
}
