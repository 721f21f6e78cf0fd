package onceriver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/onceriver"
)

// OrderArgs are the args of a job that charges an order. OrderID names the
// logical message: it is the idempotency key, not the job's ID.
type OrderArgs struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

func (OrderArgs) Kind() string { return "charge_order" }

// IdempotencyKey implements onceriver.Keyed.
func (a OrderArgs) IdempotencyKey() string { return a.OrderID }

// exampleSetup is what a worker process does at start: connect to Postgres
// (DATABASE_URL), migrate the engine's and River's tables and its own
// ledger, and build the engine (without Redis, for brevity). A demo payment
// gateway stands for the outside system the job charges.
func exampleSetup() (*pgxpool.Pool, *onceonly.Engine, *gateway.Client, func()) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if _, err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	riverMigrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	if _, err := riverMigrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (order_id text, charge_id text, amount bigint)`); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE ledger`); err != nil {
		panic(err)
	}
	if err := gateway.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	h, err := gateway.NewHandler(gateway.Config{Pool: pool, Logger: quiet})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Logger: quiet})
	if err != nil {
		panic(err)
	}
	return pool, engine, &gateway.Client{BaseURL: srv.URL}, func() { engine.Close(); srv.Close(); pool.Close() }
}

// A River worker whose job charges a payment gateway and writes a ledger
// row. The producer enqueued the order twice: the gateway is charged once,
// the ledger has one row, and both jobs complete.
func Example() {
	pool, engine, gw, cleanup := exampleSetup()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	worker, err := onceriver.NewWorker(engine, func(ctx context.Context, args OrderArgs) error {
		// An external call: a step, with a downstream key the gateway
		// deduplicates on. A rerun after a crash reuses its recorded outcome.
		charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (gateway.Charge, error) {
			fmt.Println("charging", args.OrderID)
			return gw.Charge(ctx, key, gateway.ChargeRequest{
				Amount: args.Amount, Currency: "eur", Source: gateway.SourceVisa, Reference: "orders/" + args.OrderID,
			})
		})
		if err != nil {
			return err
		}
		// The final transaction: the ledger row, the key and the job commit
		// together.
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger (order_id, charge_id, amount) VALUES ($1, $2, $3)`, args.OrderID, charge.ID, args.Amount)
		return err
	}, onceriver.Options[OrderArgs]{})
	if err != nil {
		panic(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers: workers,
		// A stuck job (its worker died) runs again once the key's lease is
		// over; River gives up on a job before the engine's lease does.
		RescueStuckJobsAfter: 2 * onceonly.DefaultLeaseTimeout,
		JobTimeout:           20 * time.Second,
		Logger:               slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	// Finishes executions whose process died after the charge.
	go func() { _ = engine.Resume(ctx) }()
	completed, unsubscribe := client.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		panic(err)
	}

	order := OrderArgs{OrderID: "order-1", Amount: 1200}
	if _, err := client.InsertMany(ctx, []river.InsertManyParams{{Args: order}, {Args: order}}); err != nil {
		panic(err)
	}
	for range 2 {
		<-completed
	}
	if err := client.Stop(ctx); err != nil {
		panic(err)
	}

	var charges, rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'orders/order-1'`).Scan(&charges)
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE order_id = 'order-1'`).Scan(&rows)
	fmt.Println("gateway charges:", charges, "ledger rows:", rows)
	// Output:
	// charging order-1
	// gateway charges: 1 ledger rows: 1
}

// A worker that only writes to Postgres gets the transaction that completes
// the key and the job.
func ExampleNewTxWorker() {
	pool, engine, _, cleanup := exampleSetup()
	defer cleanup()
	ctx := context.Background()

	worker, err := onceriver.NewTxWorker(engine, func(ctx context.Context, tx pgx.Tx, job *river.Job[OrderArgs]) error {
		fmt.Println("booking", job.Args.OrderID)
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, amount) VALUES ($1, $2)`, job.Args.OrderID, job.Args.Amount)
		return err
	}, onceriver.Options[OrderArgs]{Scope: "bookings"})
	if err != nil {
		panic(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers: workers,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	completed, unsubscribe := client.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	order := OrderArgs{OrderID: "order-7", Amount: 300}
	if _, err := client.InsertMany(ctx, []river.InsertManyParams{{Args: order}, {Args: order}}); err != nil {
		panic(err)
	}
	for range 2 {
		<-completed
	}
	if err := client.Stop(ctx); err != nil {
		panic(err)
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE order_id = 'order-7'`).Scan(&rows)
	fmt.Println("ledger rows:", rows)
	// Output:
	// booking order-7
	// ledger rows: 1
}
