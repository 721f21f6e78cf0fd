// Command gorm runs onceonly with GORM, over database/sql: a message's
// business rows, written through GORM, commit together with the
// message's idempotency key, or not at all. It handles two messages, each
// delivered twice: the first in the engine's transaction (DoSQL), the
// second in a GORM transaction of its own (DoSQLTx). Each is handled once.
//
//	DATABASE_URL=postgres://… REDIS_URL=redis://… go run .
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Shipment is the business row a message makes.
type Shipment struct {
	OrderID string `gorm:"primaryKey"`
	Carrier string
}

func run(ctx context.Context, out io.Writer) error {
	url := os.Getenv("DATABASE_URL")
	pool, err := pgxpool.New(ctx, url) // the engine's own work: claims, leases, the relay
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sqlDB, err := sql.Open("pgx", url) // GORM's, and the handlers' transactions
	if err != nil {
		return fmt.Errorf("open database/sql: %w", err)
	}
	defer sqlDB.Close()
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return fmt.Errorf("open GORM: %w", err)
	}
	if err := gdb.WithContext(ctx).AutoMigrate(&Shipment{}); err != nil {
		return fmt.Errorf("create the shipments table: %w", err)
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	engine, err := onceonly.New(onceonly.Config{Pool: pool, DB: sqlDB, Redis: rdb})
	if err != nil {
		return fmt.Errorf("onceonly: %w", err)
	}
	defer engine.Close()
	if err := engine.Start(ctx); err != nil { // the relay, the reconciler, the resumer
		return fmt.Errorf("start the engine's daemons: %w", err)
	}

	// ship is the handler of a message: it writes through tx, which it
	// must neither commit nor roll back.
	ship := func(orderID string) onceonly.SQLHandler {
		return func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
			fmt.Fprintln(out, "shipping order", orderID)
			err := withTx(ctx, gdb, tx).Create(&Shipment{OrderID: orderID, Carrier: "post"}).Error
			return onceonly.Result{Status: 201}, err
		}
	}

	// In the engine's transaction: DoSQL.
	for range 2 { // the broker delivers the message twice
		res, err := engine.DoSQL(ctx, "shipping", "msg-1", []byte(`{"order_id":"1"}`), ship("1"))
		if err != nil {
			return fmt.Errorf("msg-1: %w", err)
		}
		fmt.Fprintf(out, "msg-1: status=%d replayed=%v\n", res.Status, res.Replayed)
	}

	// In a GORM transaction of your own: DoSQLTx, whose claim and
	// completion commit with whatever else the transaction holds.
	for range 2 {
		err := gdb.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
			tx, ok := gtx.Statement.ConnPool.(*sql.Tx)
			if !ok {
				return errors.New("GORM's transaction is no *sql.Tx (PrepareStmt on?)")
			}
			res, err := engine.DoSQLTx(ctx, tx, "shipping", "msg-2", []byte(`{"order_id":"2"}`), ship("2"))
			if err != nil {
				return err // rolled back to DoSQLTx's savepoint; returning it rolls the rest back too
			}
			fmt.Fprintf(out, "msg-2: status=%d replayed=%v\n", res.Status, res.Replayed)
			return nil
		})
		if err != nil {
			return fmt.Errorf("msg-2: %w", err)
		}
	}

	var n int64
	if err := gdb.WithContext(ctx).Model(&Shipment{}).Count(&n).Error; err != nil {
		return fmt.Errorf("count shipments: %w", err)
	}
	fmt.Fprintln(out, "shipments:", n)
	return nil
}

// withTx returns gdb writing through tx, a transaction GORM did not begin
// (GORM's own Begin does the same with the transaction it begins).
func withTx(ctx context.Context, gdb *gorm.DB, tx *sql.Tx) *gorm.DB {
	g := gdb.Session(&gorm.Session{Context: ctx, NewDB: true})
	g.Statement.ConnPool = tx
	return g
}
