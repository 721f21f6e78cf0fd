package onceonly_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// The engine's database/sql path (DoSQL, SQLTx, DoSQLTx), each test on
// every driver of oncetest.SQLDrivers.

// sqlBundle is a testBundle whose engine has Config.DB, a database/sql
// handle of driver on the test's database.
type sqlBundle struct {
	*testBundle
	db *sql.DB
}

func setupSQL(t *testing.T, driver string, lease time.Duration) *sqlBundle {
	t.Helper()
	url := oncetest.DatabaseURL(t)
	b := &sqlBundle{
		testBundle: &testBundle{ctx: oncetest.Context(t), pool: oncetest.Pool(t, url), reg: prometheus.NewRegistry()},
		db:         oncetest.SQLDB(t, driver, url),
	}
	b.rdb, b.prefix = oncetest.Redis(t)
	b.engine = b.newSQLEngine(t, lease)
	// Registered after the engine's Close (cleanups run last first): every
	// transaction the engine began has ended by the end of the test.
	t.Cleanup(func() {
		oncetest.Eventually(t, 5*time.Second, "every database/sql connection back in the pool", func() bool {
			return b.db.Stats().InUse == 0
		})
	})
	return b
}

func (b *sqlBundle) newSQLEngine(t *testing.T, lease time.Duration) *onceonly.Engine {
	t.Helper()
	e, err := onceonly.New(onceonly.Config{
		Pool: b.pool, DB: b.db, Redis: b.rdb, RedisPrefix: b.prefix, LeaseTimeout: lease, Registerer: b.reg,
		SingleCommit: true, // ignored with DB: every execution runs two-phase
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// writePayment writes a payment row for key through tx, in the SQL both
// drivers take ($n parameters).
func writePayment(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
		VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded')`, key)
	return err
}

// sqlPayment is an SQLHandler that writes a payment row for key.
func sqlPayment(key string, status int, body string) onceonly.SQLHandler {
	return func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
		if err := writePayment(ctx, tx, key); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: status, ContentType: "application/json", Body: []byte(body)}, nil
	}
}

// untilAnswered calls do until it answers with something other than an
// *InFlightError, as a client honoring Retry-After would (without its
// wait: the duplicates here are meant to collide).
func untilAnswered(ctx context.Context, do func() (onceonly.Outcome, error)) (onceonly.Outcome, error) {
	for {
		out, err := do()
		if _, inFlight := onceonly.IsInFlight(err); !inFlight || ctx.Err() != nil {
			return out, err
		}
	}
}

// TestSQLExactlyOnceUnderDuplicates: 20 concurrent duplicates through
// DoSQL, and through DoSQLTx in 20 transactions of their own, run the
// handler once and write one row; every one of them gets its answer.
func TestSQLExactlyOnceUnderDuplicates(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, 5*time.Second)
		const duplicates = 20
		for _, entry := range []string{"DoSQL", "DoSQLTx"} {
			key := "dup-" + entry
			var runs atomic.Int32
			handler := func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
				n := runs.Add(1)
				return sqlPayment(key, 201, fmt.Sprintf(`{"run":%d}`, n))(ctx, tx)
			}
			do := func() (onceonly.Outcome, error) {
				if entry == "DoSQL" {
					return b.engine.DoSQL(b.ctx, "m", key, []byte("p"), handler)
				}
				tx, err := b.db.BeginTx(b.ctx, nil)
				if err != nil {
					return onceonly.Outcome{}, err
				}
				defer func() { _ = tx.Rollback() }()
				out, err := b.engine.DoSQLTx(b.ctx, tx, "m", key, []byte("p"), handler)
				if err != nil {
					return out, err
				}
				return out, tx.Commit()
			}
			var wg sync.WaitGroup
			outs, errs := make([]onceonly.Outcome, duplicates), make([]error, duplicates)
			for i := range duplicates {
				wg.Go(func() { outs[i], errs[i] = untilAnswered(b.ctx, do) })
			}
			wg.Wait()
			executed := 0
			for i := range duplicates {
				require.NoError(t, errs[i], entry)
				require.Equal(t, `{"run":1}`, string(outs[i].Body), entry)
				if !outs[i].Replayed {
					executed++
				}
			}
			require.Equal(t, 1, executed, entry)
			require.EqualValues(t, 1, runs.Load(), entry)
			require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, key), entry)
			require.Equal(t, "completed", b.keyStatus(t, key), entry)
		}
	})
}

// TestSQLReplays: a later call gets the stored answer without running the
// handler, from Redis after DoSQL's write-through, from Postgres after
// DoSQLTx's (whose commit the engine does not see); the middleware's
// handler writes through SQLTx and is replayed too.
func TestSQLReplays(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, 5*time.Second)
		first, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 201, `{"id":1}`))
		require.NoError(t, err)
		require.False(t, first.Replayed)
		again, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 201, `{"id":2}`))
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Result, again.Result)
		require.Equal(t, 1.0, b.outcomes("replayed_cache"))
		_, err = b.engine.DoSQL(b.ctx, "m", "k", []byte("other"), sqlPayment("k", 201, `{}`))
		require.ErrorIs(t, err, onceonly.ErrKeyReused)

		for range 2 {
			tx, err := b.db.BeginTx(b.ctx, nil)
			require.NoError(t, err)
			out, err := b.engine.DoSQLTx(b.ctx, tx, "m", "k-tx", []byte("p"), sqlPayment("k-tx", 201, `{"id":3}`))
			require.NoError(t, err)
			require.JSONEq(t, `{"id":3}`, string(out.Body))
			require.NoError(t, tx.Commit())
		}
		require.Equal(t, 1.0, b.outcomes("replayed_db"))
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k"))
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k-tx"))

		srv := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{
			Scope: func(*http.Request) (string, error) { return "tenant", nil },
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := onceonly.SQLTx(r.Context())
			if err == nil {
				err = writePayment(r.Context(), tx, "k-http")
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":4}`)
		})))
		t.Cleanup(srv.Close)
		for i := range 2 {
			a := post(b.ctx, t, srv.URL, "k-http", `{"amount":1}`)
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, i == 1, a.header.Get(onceonly.HeaderReplayed) == "true")
		}
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k-http"))
	})
}

// TestSQLFailureRollsBackAndIsRetryable: a handler error, a status that is
// not stored and a panic roll the handler's writes back and leave the key
// retryable; in DoSQLTx the caller's own writes and transaction survive.
func TestSQLFailureRollsBackAndIsRetryable(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, 5*time.Second)
		boom := errors.New("boom")
		failing := func(key string) onceonly.SQLHandler {
			return func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
				if err := writePayment(ctx, tx, key); err != nil {
					return onceonly.Result{}, err
				}
				return onceonly.Result{}, boom
			}
		}
		_, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), failing("k"))
		require.ErrorIs(t, err, boom)
		var failed *onceonly.ExecutionError
		require.ErrorAs(t, err, &failed)
		require.Equal(t, 1, failed.Failures, "counted as on the pgx path")
		require.Equal(t, "failed", b.keyStatus(t, "k"))
		out, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 502, `{}`))
		require.NoError(t, err)
		require.Equal(t, 502, out.Status)
		require.Panics(t, func() {
			_, _ = b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
				_ = writePayment(ctx, tx, "k")
				panic("handler bug")
			})
		})
		require.Equal(t, 0, paymentRows(t, b.ctx, b.pool, "k"))
		require.Equal(t, "failed", b.keyStatus(t, "k"))
		out, err = b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 201, `{}`))
		require.NoError(t, err)
		require.False(t, out.Replayed)
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k"))

		// DoSQLTx: the savepoint is rolled back, even after a statement
		// failed inside it; the caller's transaction goes on and commits
		// its own rows, without the key.
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		require.NoError(t, writePayment(b.ctx, tx, "caller"))
		_, err = b.engine.DoSQLTx(b.ctx, tx, "m", "k-tx", []byte("p"), failing("k-tx"))
		require.ErrorIs(t, err, boom)
		_, err = b.engine.DoSQLTx(b.ctx, tx, "m", "k-tx", []byte("p"), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
			if err := writePayment(ctx, tx, "k-tx"); err != nil {
				return onceonly.Result{}, err
			}
			_, err := tx.ExecContext(ctx, `SELECT 1/0`) // the transaction is aborted
			return onceonly.Result{}, err
		})
		require.Error(t, err)
		require.NoError(t, writePayment(b.ctx, tx, "caller"))
		require.NoError(t, tx.Commit())
		require.Equal(t, 2, paymentRows(t, b.ctx, b.pool, "caller"))
		require.Equal(t, 0, paymentRows(t, b.ctx, b.pool, "k-tx"))
		require.Equal(t, "absent", b.keyStatus(t, "k-tx"))

		tx, err = b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		out, err = b.engine.DoSQLTx(b.ctx, tx, "m", "k-tx", []byte("p"), sqlPayment("k-tx", 201, `{}`))
		require.NoError(t, err)
		require.False(t, out.Replayed)
		require.NoError(t, tx.Commit())
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k-tx"))
		require.Equal(t, "completed", b.keyStatus(t, "k-tx"))
	})
}

// TestSQLTakenOverExecutionCannotCommit: an execution whose lease was
// taken over while its handler held uncommitted writes cannot commit
// them: its completion, fenced by the owner, fails in its database/sql
// transaction, which rolls back (ErrLeaseLost); the new owner's commit
// is the only one.
func TestSQLTakenOverExecutionCannotCommit(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, time.Hour)
		b.takeOver(t, func(who string, g *gate) error {
			_, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
				if err := writePayment(ctx, tx, "k"); err != nil { // uncommitted while the key is taken over
					return onceonly.Result{}, err
				}
				g.wait()
				return onceonly.Result{Status: 201, Body: []byte(`{"who":"` + who + `"}`)}, nil
			})
			return err
		})
		out, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 201, `{}`))
		require.NoError(t, err)
		require.True(t, out.Replayed)
		require.JSONEq(t, `{"who":"new"}`, string(out.Body))
	})
}

// TestSQLLostLeaseStopsTheHandler: a renewal that finds the key taken
// cancels the handler's context (cause ErrLeaseLost) while it waits in
// its database/sql transaction; the engine rolls that transaction back
// and returns its connection.
func TestSQLLostLeaseStopsTheHandler(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, time.Second) // renewed every third of a second
		written := make(chan struct{})
		done := make(chan error)
		go func() {
			_, err := b.engine.DoSQL(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
				if err := writePayment(ctx, tx, "k"); err != nil {
					return onceonly.Result{}, err
				}
				close(written)
				<-ctx.Done()
				return onceonly.Result{}, context.Cause(ctx)
			})
			done <- err
		}()
		<-written
		_, err := b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET owner = gen_random_uuid() WHERE key = 'k'`)
		require.NoError(t, err)
		require.ErrorIs(t, <-done, onceonly.ErrLeaseLost)
		require.Equal(t, 0, paymentRows(t, b.ctx, b.pool, "k"))
		oncetest.Eventually(t, 5*time.Second, "the transaction's connection back in the pool", func() bool {
			return b.db.Stats().InUse == 0
		})
	})
}

// TestSQLStepThenSQLTx: a registered Func steps, then writes through
// SQLTx. The step's outcome is reused by the retry after a failed write,
// and an unknown outcome is settled by the engine's own resumption, whose
// write goes through SQLTx too.
func TestSQLStepThenSQLTx(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, 2*time.Second)
		h := &ledgerHandler{remote: newRemote(), sql: true,
			failCommit: func(a int32) bool { return a == 1 }, loseAnswer: func(a int32) bool { return a == 3 }}
		require.NoError(t, b.engine.Register("ledger", h.run))

		_, err := b.engine.Run(b.ctx, "ledger", "m", "k1", []byte(`{}`))
		require.Error(t, err, "the final write failed")
		require.Equal(t, "in_progress", b.keyStatus(t, "k1"), "handed off after its step")
		out, err := b.engine.Run(b.ctx, "ledger", "m", "k1", []byte(`{}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Status)
		calls, _ := h.remote.stats()
		require.Equal(t, 1, calls, "the recorded outcome is reused")
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k1"))

		out, err = b.engine.Run(b.ctx, "ledger", "m", "k2", []byte(`{}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusBadGateway, out.Status, "the step's answer was lost")
		require.Equal(t, "in_progress", b.keyStatus(t, "k2"))
		n, err := b.engine.ResumeOnce(b.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "completed", b.keyStatus(t, "k2"))
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, "k2"))
		calls, keys := h.remote.stats()
		require.Equal(t, 3, calls)
		require.Equal(t, 2, keys, "k2's step called again with the same downstream key")
		replay, err := b.engine.Run(b.ctx, "ledger", "m", "k2", []byte(`{}`))
		require.NoError(t, err)
		require.True(t, replay.Replayed)
	})
}

// TestSQLTxRules: an execution has one transaction, of one kind; steps
// come before it; SQLTx needs Config.DB except in DoSQLTx, where it is the
// caller's transaction.
func TestSQLTxRules(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setupSQL(t, driver, 5*time.Second)
		_, err := onceonly.SQLTx(b.ctx)
		require.ErrorIs(t, err, onceonly.ErrNoExecution)
		require.NoError(t, b.engine.Register("rules", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
			tx, err := onceonly.SQLTx(ctx)
			if err != nil {
				return onceonly.Result{}, err
			}
			again, err := x.SQLTx(ctx)
			if err != nil || again != tx {
				return onceonly.Result{}, fmt.Errorf("a second SQLTx: %w", err)
			}
			if _, err := onceonly.Tx(ctx); !errors.Is(err, onceonly.ErrTxKind) {
				return onceonly.Result{}, fmt.Errorf("Tx after SQLTx: %w", err)
			}
			if _, err := onceonly.Step(ctx, "late", func(context.Context, string) (int, error) { return 1, nil }); !errors.Is(err, onceonly.ErrStepAfterTx) {
				return onceonly.Result{}, fmt.Errorf("Step after SQLTx: %w", err)
			}
			return onceonly.Result{Status: 201}, nil
		}))
		_, err = b.engine.Run(b.ctx, "rules", "m", "rules", []byte(`{}`))
		require.NoError(t, err)

		_, err = b.engine.Do(b.ctx, "m", "pgx-first", []byte("p"), func(ctx context.Context, _ pgx.Tx) (onceonly.Result, error) {
			_, err := onceonly.SQLTx(ctx)
			return onceonly.Result{}, err
		})
		require.ErrorIs(t, err, onceonly.ErrTxKind)

		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = b.engine.DoSQLTx(b.ctx, tx, "m", "caller", []byte("p"), func(ctx context.Context, given *sql.Tx) (onceonly.Result, error) {
			if got, err := onceonly.SQLTx(ctx); err != nil || got != tx || given != tx {
				return onceonly.Result{}, fmt.Errorf("SQLTx in DoSQLTx: %w", err)
			}
			_, err := onceonly.Tx(ctx)
			return onceonly.Result{}, err
		})
		require.ErrorIs(t, err, onceonly.ErrTxKind)

		// A *sql.Tx cannot refuse Commit: a handler that commits the
		// caller's tx gets ErrCommitByHandler, not ErrUnavailable.
		own, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = own.Rollback() }()
		_, err = b.engine.DoSQLTx(b.ctx, own, "m", "committed-by-handler", []byte("p"), func(_ context.Context, tx *sql.Tx) (onceonly.Result, error) {
			return onceonly.Result{Status: 201}, tx.Commit()
		})
		require.ErrorIs(t, err, onceonly.ErrCommitByHandler)

		plain := setup(t, setupOpts{})
		_, err = plain.engine.DoSQL(b.ctx, "m", "k", []byte("p"), sqlPayment("k", 201, `{}`))
		require.ErrorIs(t, err, onceonly.ErrNoSQLDB)
		_, err = plain.engine.Do(b.ctx, "m", "no-db", []byte("p"), func(ctx context.Context, _ pgx.Tx) (onceonly.Result, error) {
			_, err := onceonly.SQLTx(ctx)
			return onceonly.Result{}, err
		})
		require.ErrorIs(t, err, onceonly.ErrNoSQLDB)
		_, err = plain.engine.DoSQLTx(b.ctx, tx, "m", "no-db", []byte("p"), sqlPayment("no-db", 201, `{}`))
		require.NoError(t, err, "DoSQLTx needs no Config.DB")
	})
}
