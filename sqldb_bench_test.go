package onceonly_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/internal/testenv"
)

// BenchmarkDo and BenchmarkDoSQL measure the pgx path and the database/sql
// path side by side, with Redis, each execution writing one payment row:
// first executions in the engine's transaction (Do, DoSQL), replays (from
// Redis), and first executions in a transaction the caller begins and
// commits (DoTx, DoSQLTx); the database/sql path on each driver of
// testenv.SQLDrivers (pgx's stdlib, lib/pq, lib/pq with binary_parameters):
//
//	go test -run '^$' -bench '^BenchmarkDo(SQL)?$' -benchtime 2000x -benchmem .
func BenchmarkDo(b *testing.B) {
	e, pool, _ := benchEngine(b, "")
	insert := func(ctx context.Context, tx pgx.Tx, key string) (onceonly.Result, error) {
		_, err := tx.Exec(ctx, benchInsert, key)
		return onceonly.Result{Status: 201, Body: []byte(`{"id":1}`)}, err
	}
	benchEntries(b, benchEntry{
		do: func(ctx context.Context, key string) error {
			_, err := e.Do(ctx, "bench", key, []byte(`{}`), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				return insert(ctx, tx, key)
			})
			return err
		},
		doTx: func(ctx context.Context, key string) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := e.DoTx(ctx, tx, "bench", key, []byte(`{}`), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				return insert(ctx, tx, key)
			}); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	})
}

func BenchmarkDoSQL(b *testing.B) {
	for _, driver := range testenv.SQLDrivers {
		b.Run(driver, func(b *testing.B) {
			e, _, db := benchEngine(b, driver)
			insert := func(ctx context.Context, tx *sql.Tx, key string) (onceonly.Result, error) {
				_, err := tx.ExecContext(ctx, benchInsert, key)
				return onceonly.Result{Status: 201, Body: []byte(`{"id":1}`)}, err
			}
			benchEntries(b, benchEntry{
				do: func(ctx context.Context, key string) error {
					_, err := e.DoSQL(ctx, "bench", key, []byte(`{}`), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
						return insert(ctx, tx, key)
					})
					return err
				},
				doTx: func(ctx context.Context, key string) error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if _, err := e.DoSQLTx(ctx, tx, "bench", key, []byte(`{}`), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
						return insert(ctx, tx, key)
					}); err != nil {
						return err
					}
					return tx.Commit()
				},
			})
		})
	}
}

const benchInsert = `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
	VALUES ($1, 'bench', $1, 1, 'usd', 'c', 'succeeded')`

// benchEntry runs one request for key: in the engine's transaction (do),
// or in one the caller begins and commits (doTx).
type benchEntry struct {
	do, doTx func(ctx context.Context, key string) error
}

// benchEngine returns an engine on a database of the benchmark's own and
// the test Redis, with its pool and, when driver is not "", a
// database/sql handle of driver on the same database as Config.DB.
func benchEngine(b *testing.B, driver string) (*onceonly.Engine, *pgxpool.Pool, *sql.DB) {
	b.Helper()
	url := testenv.DatabaseURL(b)
	pool := testenv.Pool(b, url)
	rdb, prefix := testenv.Redis(b)
	cfg := onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 30 * time.Second, Logger: testenv.QuietLogger()}
	if driver != "" {
		cfg.DB = testenv.SQLDB(b, driver, url)
	}
	e, err := onceonly.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	return e, pool, cfg.DB
}

// benchEntries runs the sub-benchmarks of an entry: first executions,
// replays, and first executions in the caller's transaction.
func benchEntries(b *testing.B, entry benchEntry) {
	ctx := testenv.Context(b)
	b.Run("first", func(b *testing.B) {
		run := testenv.RandomSuffix(8) // keys of their own in every round (-count)
		for i := range b.N {
			if err := entry.do(ctx, run+"-first-"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		key := testenv.RandomSuffix(8) + "-replay"
		if err := entry.do(ctx, key); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := entry.do(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("caller-tx", func(b *testing.B) {
		run := testenv.RandomSuffix(8)
		for i := range b.N {
			if err := entry.doTx(ctx, run+"-tx-"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
