package onceonly_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"; lib/pq ("postgres") works too

	"github.com/onceonly/onceonly"
)

// A consumer whose code is on database/sql (sqlx, sqlc, an ORM): the
// handler writes through tx, a transaction on Config.DB that commits with
// the key's completion. A redelivery gets the stored result and the
// handler does not run again.
func ExampleEngine_DoSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // the engine's database
	if err != nil {
		panic(err)
	}
	defer db.Close()
	engine, cleanup := exampleEngineWith(ctx, db) // onceonly.Config{Pool: pool, DB: db, Redis: rdb}
	defer cleanup()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	handle := func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
		fmt.Println("shipping order 7")
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, "7")
		return onceonly.Result{Status: 201, Body: []byte(`{"shipped":"7"}`)}, err
	}
	for range 2 { // the broker delivers the message twice
		out, err := engine.DoSQL(ctx, "shipping", "msg-0007", []byte(`{"order_id":"7"}`), handle)
		if err != nil {
			panic(err)
		}
		fmt.Printf("status=%d body=%s replayed=%v\n", out.Status, out.Body, out.Replayed)
	}
	// Output:
	// shipping order 7
	// status=201 body={"shipped":"7"} replayed=false
	// status=201 body={"shipped":"7"} replayed=true
}

// A message taken from an inbox table in a database/sql transaction of
// your own: the key's claim and completion, the handler's writes and the
// message's deletion commit together, or not at all.
func ExampleEngine_DoSQLTx() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	engine, cleanup := exampleEngineWith(ctx, nil) // DoSQLTx needs no Config.DB
	defer cleanup()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS inbox (id text PRIMARY KEY, body jsonb NOT NULL);
		CREATE TABLE IF NOT EXISTS shipments (order_id text PRIMARY KEY);
		INSERT INTO inbox VALUES ('msg-0008', '{"order_id":"8"}')`); err != nil {
		panic(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var id string
	var body []byte
	if err := tx.QueryRowContext(ctx, `SELECT id, body FROM inbox ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id, &body); err != nil {
		panic(err)
	}
	out, err := engine.DoSQLTx(ctx, tx, "inbox", id, body, func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1::jsonb->>'order_id')`, string(body))
		return onceonly.Result{Status: 201}, err
	})
	if err != nil {
		panic(err) // rolled back to DoSQLTx's savepoint: tx is still usable
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM inbox WHERE id = $1`, id); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	var shipped string
	if err := db.QueryRowContext(ctx, `SELECT order_id FROM shipments WHERE order_id = '8'`).Scan(&shipped); err != nil {
		panic(err)
	}
	fmt.Printf("status=%d replayed=%v shipped=%s\n", out.Status, out.Replayed, shipped)
	// Output:
	// status=201 replayed=false shipped=8
}
