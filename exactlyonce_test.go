package onceonly_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// These tests hammer one key space with no Redis in front, so only
// Postgres keeps executions apart, and count what each handler run did.
// Each would fail without the guard it names: the probe read after the
// key's lock (one-commit begin), the failed row written in the execution's
// own transaction, the lock every mode takes, the failed row of an
// overrun.

// poolOf returns a pool of b's database with size connections, closed
// when the test ends: a test whose executions hold their connections for
// long (a one-commit execution holds one throughout) sizes its pool to its
// callers, as a deployment does.
func (b *testBundle) poolOf(t *testing.T, size int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// runLog records the handler runs of each key: how many ran at once (I4),
// how many returned a result to commit, and what each caller was told.
type runLog struct {
	mu        sync.Mutex
	running   map[string]int
	overlaps  []string
	succeeded map[string]int
	answers   map[string]map[string]int // key → body → callers
	lost      []string                  // callers told ErrLeaseLost
}

func newRunLog() *runLog {
	return &runLog{running: map[string]int{}, succeeded: map[string]int{}, answers: map[string]map[string]int{}}
}

// start records a run of key starting; the returned func records its end,
// a success when ok.
func (l *runLog) start(key string) (end func(ok bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running[key]++; l.running[key] > 1 {
		l.overlaps = append(l.overlaps, key)
	}
	return func(ok bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.running[key]--
		if ok {
			l.succeeded[key]++
		}
	}
}

// answer records what a caller of key was told in the end.
func (l *runLog) answer(key, body string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answers[key] == nil {
		l.answers[key] = map[string]int{}
	}
	l.answers[key][body]++
}

func (l *runLog) leaseLost(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = append(l.lost, key)
}

// check asserts, over keys: no two runs of a key overlapped, one run of
// each returned a result (a second one ran after the first committed, or
// its result was discarded), every caller got the same answer, no caller
// was told its execution was lost, and one business row per key.
func (l *runLog) check(t *testing.T, b *testBundle, keys []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.overlaps, "runs of one key overlapped")
	require.Empty(t, l.lost, "callers told their execution was lost")
	for _, key := range keys {
		require.Equal(t, 1, l.succeeded[key], "successful runs of %s", key)
		require.Len(t, l.answers[key], 1, "answers of %s: %v", key, l.answers[key])
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, key), "business rows of %s", key)
	}
}

// chargeOnce returns a handler of key that records its run in l; fail
// says whether this run fails.
func chargeOnce(l *runLog, key string, fail func() bool) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		end := l.start(key)
		res, err := chargeKey(key)(ctx, tx)
		if err == nil && fail() {
			err = errors.New("the card network failed")
		}
		end(err == nil)
		return res, err
	}
}

// callUntilAnswered calls do until it is answered: at once again after a
// 409 or a failure (as a client loop, Wait or a broker redelivery does).
func callUntilAnswered(ctx context.Context, t *testing.T, l *runLog, key string, do func() (onceonly.Outcome, error)) {
	for {
		out, err := do()
		var failed *onceonly.ExecutionError
		_, inFlight := onceonly.IsInFlight(err)
		switch {
		case err == nil:
			l.answer(key, string(out.Body))
			return
		case inFlight, errors.As(err, &failed):
		case errors.Is(err, onceonly.ErrLeaseLost):
			l.leaseLost(key)
		case ctx.Err() != nil:
			t.Errorf("%s: no answer before the test ended: %v", key, err)
			return
		default:
			t.Errorf("%s: %v", key, err)
			return
		}
	}
}

// Finding 1: callers that retry at once on 409 never run the handler on a
// key that completed meanwhile. The one-commit begin probed the key's row
// in the statement that took the lock, whose snapshot predates the lock:
// a commit landing between the two gave "locked, no row".
func TestRetriesAtOnceNeverRunAfterACommit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	l := newRunLog()
	keys := make([]string, 150)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		for range 4 {
			wg.Go(func() {
				callUntilAnswered(b.ctx, t, l, keys[i], func() (onceonly.Outcome, error) {
					return e.Do(b.ctx, "tenant", keys[i], []byte("p"), chargeOnce(l, keys[i], func() bool { return false }))
				})
			})
		}
	}
	wg.Wait()
	l.check(t, b, keys)
}

// Finding 2: a failed execution never discards the next, successful one.
// The failed row was written after the rollback released the lock, on
// another connection: a retry that took the lock in between succeeded,
// and its commit was then refused.
func TestFailureNeverDiscardsTheNextExecution(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	l := newRunLog()
	keys := make([]string, 60)
	var firstRun sync.Map
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		fail := func() bool { _, ran := firstRun.LoadOrStore(keys[i], true); return !ran } // the first run fails
		for range 3 {
			wg.Go(func() {
				callUntilAnswered(b.ctx, t, l, keys[i], func() (onceonly.Outcome, error) {
					return e.Do(b.ctx, "tenant", keys[i], []byte("p"), chargeOnce(l, keys[i], fail))
				})
			})
		}
	}
	wg.Wait()
	l.check(t, b, keys)
}

// Finding 3: executions of one key never run at once, whatever their
// modes: a default engine's (one commit), a two-phase engine's, DoTx's,
// DoSQLTx's and a Config.DB engine's, side by side. Two-phase claims and
// callers' transactions took no lock, and could not see an uncommitted
// one-commit execution.
func TestModesExcludeEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	pool := b.poolOf(t, 48) // every caller of a round in Postgres at once
	db := oncetest.SQLDB(t, "pgx", b.pool.Config().ConnString())
	engine := func(cfg onceonly.Config) *onceonly.Engine {
		cfg.Pool = pool
		e, err := onceonly.New(cfg)
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return e
	}
	single, twoPhase, withDB := engine(onceonly.Config{}), engine(onceonly.Config{TwoPhase: true}), engine(onceonly.Config{DB: db})

	l := newRunLog()
	// A handler that takes a while, so that another mode's execution
	// would overlap it.
	pause := func() { time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond) }
	slow := func(key string) onceonly.Handler {
		return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			end := l.start(key)
			pause()
			res, err := chargeKey(key)(ctx, tx)
			end(err == nil)
			return res, err
		}
	}
	modes := []func(key string) (onceonly.Outcome, error){
		func(key string) (onceonly.Outcome, error) {
			return single.Do(b.ctx, "tenant", key, []byte("p"), slow(key))
		},
		func(key string) (onceonly.Outcome, error) {
			return twoPhase.Do(b.ctx, "tenant", key, []byte("p"), slow(key))
		},
		func(key string) (onceonly.Outcome, error) {
			return withDB.Do(b.ctx, "tenant", key, []byte("p"), slow(key))
		},
		func(key string) (onceonly.Outcome, error) {
			tx, err := pool.Begin(b.ctx)
			if err != nil {
				return onceonly.Outcome{}, err
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			out, err := single.DoTx(b.ctx, tx, "tenant", key, []byte("p"), slow(key))
			if err != nil {
				return out, err
			}
			return out, tx.Commit(b.ctx)
		},
		func(key string) (onceonly.Outcome, error) {
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				return onceonly.Outcome{}, err
			}
			defer func() { _ = tx.Rollback() }()
			out, err := single.DoSQLTx(b.ctx, tx, "tenant", key, []byte("p"), func(ctx context.Context, stx *sql.Tx) (onceonly.Result, error) {
				end := l.start(key)
				pause()
				_, err := stx.ExecContext(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
					VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded')`, key)
				end(err == nil)
				return onceonly.Result{Status: 201, Body: []byte(key)}, err
			})
			if err != nil {
				return out, err
			}
			return out, tx.Commit()
		},
	}
	// Rounds of a few keys, every mode calling each key at once.
	keys := make([]string, 0, 30*6)
	for round := range 30 {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 6 {
			key := fmt.Sprintf("r%d-k%d", round, i)
			keys = append(keys, key)
			for c := range modes {
				do := modes[(i+c)%len(modes)]
				wg.Go(func() {
					<-start
					callUntilAnswered(b.ctx, t, l, key, func() (onceonly.Outcome, error) { return do(key) })
				})
			}
		}
		close(start)
		wg.Wait()
	}
	l.check(t, b, keys)
}

// Finding 5: a one-commit execution whose transaction Postgres ended
// under it (its connection terminated here; an idle timeout, a failover)
// runs out its lease, and then leaves the key failed with its fingerprint,
// counts a failure and tells its caller so — not "taken over". It left no
// row: the key took another payload, and a consumer retried it forever.
func TestOverrunFailsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	const lease = time.Second
	e := b.singleEngine(t, lease)
	ended := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return onceonly.Result{}, err
		}
		if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return onceonly.Result{}, err
		}
		<-ctx.Done() // deaf to everything but its lease
		return onceonly.Result{}, context.Cause(ctx)
	}
	_, err := e.Do(b.ctx, "tenant", "slow", []byte("p"), ended)
	require.ErrorIs(t, err, onceonly.ErrLeaseExpired)
	var failed *onceonly.ExecutionError
	require.ErrorAs(t, err, &failed)
	require.Equal(t, 1, failed.Failures, "the overrun is counted")

	var status, fingerprint string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status, fingerprint FROM idempotency_keys WHERE key = 'slow'`).Scan(&status, &fingerprint))
	require.Equal(t, "failed", status)
	require.NotEmpty(t, fingerprint)

	_, err = e.Do(b.ctx, "tenant", "slow", []byte("another payload"), payment(201, `{}`))
	require.ErrorIs(t, err, onceonly.ErrKeyReused, "the failed key keeps its fingerprint (I3)")
	out, err := e.Do(b.ctx, "tenant", "slow", []byte("p"), payment(201, `{"ok":true}`))
	require.NoError(t, err, "a retry runs again")
	require.JSONEq(t, `{"ok":true}`, string(out.Body))
}

// Finding 6: the key's lock id is keyed by the database's secret and lives
// in a class of its own: the lock id an unkeyed hash gives is not the
// key's, and a session holding it (another tenant's execution, the
// reconciler's pass lock, an application's lock) does not hold up the key.
func TestKeyLocksCannotBeAimed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	// Hold the lock id of the previous release's scheme for acct_victim's key.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `SELECT pg_advisory_xact_lock(hashtextextended('acct_victim:order-123', 0))`)
	require.NoError(t, err)

	running := make(chan struct{})
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // a failed assertion below must not leave the handler waiting
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(b.ctx, "acct_victim", "order-123", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			close(running)
			<-release
			return payment(201, `{}`)(ctx, tx)
		})
		done <- err
	}()
	select {
	case <-running:
	case err := <-done:
		require.NoError(t, err, "the victim's execution, beside the aimed lock")
	case <-b.ctx.Done():
		t.Fatal("the victim's execution did not run beside the aimed lock")
	}

	var class int64
	var keyed bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT classid::bigint, objid = onceonly_key_lock_id('acct_victim', 'order-123')::oid
		FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&class, &keyed))
	require.Equal(t, int64(1330529093), class, "the keys' own lock class")
	require.True(t, keyed, "the lock id is the keyed one")
	releaseOnce()
	require.NoError(t, <-done)

	var secrets int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT secret) FROM idempotency_lock_secret`).Scan(&secrets))
	require.Equal(t, 1, secrets)
}
