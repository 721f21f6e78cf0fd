package onceonly_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkDo and BenchmarkDoSQL measure the pgx path and the database/sql
// path, with Redis, each execution writing one payment row: first
// executions in the engine's transaction (Do, DoSQL), replays (from
// Redis), and first executions in a transaction the caller begins and
// commits (DoTx, DoSQLTx); the database/sql path on each driver of
// oncetest.SQLDrivers (pgx's stdlib, lib/pq, lib/pq with
// binary_parameters). Their allocations are exact; their times drift with
// whatever else the machine runs meanwhile, which BenchmarkDoInterleaved
// spreads over every variant alike:
//
//	go test -run '^$' -bench '^BenchmarkDo(SQL|Interleaved)?$' -benchtime 2000x -benchmem .
func BenchmarkDo(b *testing.B) {
	bed := newBenchBed(b)
	benchEntries(b, bed.pgxEntry(bed.engine(b, nil)))
}

func BenchmarkDoSQL(b *testing.B) {
	for _, driver := range oncetest.SQLDrivers {
		b.Run(driver, func(b *testing.B) {
			bed := newBenchBed(b)
			db := oncetest.SQLDB(b, driver, bed.url)
			benchEntries(b, sqlEntry(bed.engine(b, db), db))
		})
	}
}

// BenchmarkDoInterleaved runs a first execution of every variant in turn
// (Do, DoSQL on each driver; then DoTx, DoSQLTx) on one database, so a
// machine shared with other work slows them alike, and reports the median
// time of each (µs/<variant>); ns/op is the time of one round of all.
func BenchmarkDoInterleaved(b *testing.B) {
	bed := newBenchBed(b)
	names := make([]string, 0, 1+len(oncetest.SQLDrivers))
	entries := make([]benchEntry, 0, cap(names))
	names = append(names, "Do")
	entries = append(entries, bed.pgxEntry(bed.engine(b, nil)))
	for _, driver := range oncetest.SQLDrivers {
		db := oncetest.SQLDB(b, driver, bed.url)
		names = append(names, "DoSQL-"+driver)
		entries = append(entries, sqlEntry(bed.engine(b, db), db))
	}
	ctx := oncetest.Context(b)
	run := oncetest.RandomSuffix(8)
	times := make([][]time.Duration, 2*len(entries))
	b.ResetTimer()
	for i := range b.N {
		for j := range entries {
			k := (i + j) % len(entries) // each variant first in turn
			for tx, do := range []func(context.Context, string) error{entries[k].do, entries[k].doTx} {
				start := time.Now()
				if err := do(ctx, run+"-"+strconv.Itoa(k)+"-"+strconv.Itoa(tx)+"-"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
				times[2*k+tx] = append(times[2*k+tx], time.Since(start))
			}
		}
	}
	b.StopTimer()
	for k, name := range names {
		b.ReportMetric(median(times[2*k]), "µs/"+name)
		b.ReportMetric(median(times[2*k+1]), "µs/"+name+"-caller-tx")
	}
}

// median returns the median of ds in microseconds.
func median(ds []time.Duration) float64 {
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Microseconds())
}

const benchInsert = `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
	VALUES ($1, 'bench', $1, 1, 'usd', 'c', 'succeeded')`

// benchEntry runs a first execution for key: in the engine's transaction
// (do), or in one the caller begins and commits (doTx).
type benchEntry struct {
	do, doTx func(ctx context.Context, key string) error
}

// benchBed is a database of the benchmark's own, its pool, and the test
// Redis.
type benchBed struct {
	url  string
	pool *pgxpool.Pool
	cfg  onceonly.Config
}

func newBenchBed(b *testing.B) *benchBed {
	b.Helper()
	url := oncetest.DatabaseURL(b)
	pool := oncetest.Pool(b, url)
	rdb, prefix := oncetest.Redis(b)
	return &benchBed{url: url, pool: pool, cfg: onceonly.Config{
		Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 30 * time.Second, Logger: oncetest.QuietLogger(),
	}}
}

// engine returns an engine on the bed with db as Config.DB (nil: none).
func (bed *benchBed) engine(b *testing.B, db *sql.DB) *onceonly.Engine {
	b.Helper()
	cfg := bed.cfg
	cfg.DB = db
	e, err := onceonly.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	return e
}

// pgxEntry is the pgx path: Do, and DoTx in a transaction on the bed's pool.
func (bed *benchBed) pgxEntry(e *onceonly.Engine) benchEntry {
	insert := func(key string) onceonly.Handler {
		return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			_, err := tx.Exec(ctx, benchInsert, key)
			return onceonly.Result{Status: 201, Body: []byte(`{"id":1}`)}, err
		}
	}
	return benchEntry{
		do: func(ctx context.Context, key string) error {
			_, err := e.Do(ctx, "bench", key, []byte(`{}`), insert(key))
			return err
		},
		doTx: func(ctx context.Context, key string) error {
			tx, err := bed.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := e.DoTx(ctx, tx, "bench", key, []byte(`{}`), insert(key)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	}
}

// sqlEntry is the database/sql path: DoSQL, and DoSQLTx in a transaction
// on db.
func sqlEntry(e *onceonly.Engine, db *sql.DB) benchEntry {
	insert := func(key string) onceonly.SQLHandler {
		return func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
			_, err := tx.ExecContext(ctx, benchInsert, key)
			return onceonly.Result{Status: 201, Body: []byte(`{"id":1}`)}, err
		}
	}
	return benchEntry{
		do: func(ctx context.Context, key string) error {
			_, err := e.DoSQL(ctx, "bench", key, []byte(`{}`), insert(key))
			return err
		},
		doTx: func(ctx context.Context, key string) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := e.DoSQLTx(ctx, tx, "bench", key, []byte(`{}`), insert(key)); err != nil {
				return err
			}
			return tx.Commit()
		},
	}
}

// benchEntries runs the sub-benchmarks of an entry: first executions,
// replays, and first executions in the caller's transaction.
func benchEntries(b *testing.B, entry benchEntry) {
	ctx := oncetest.Context(b)
	b.Run("first", func(b *testing.B) {
		run := oncetest.RandomSuffix(8) // keys of their own in every round (-count)
		for i := range b.N {
			if err := entry.do(ctx, run+"-first-"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		key := oncetest.RandomSuffix(8) + "-replay"
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
		run := oncetest.RandomSuffix(8)
		for i := range b.N {
			if err := entry.doTx(ctx, run+"-tx-"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
