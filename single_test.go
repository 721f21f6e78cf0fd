package onceonly_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

// singleEngine is an engine of b's pool and Redis in the default
// configuration, whose executions begin as one commit.
func (b *testBundle) singleEngine(t *testing.T, lease time.Duration) *onceonly.Engine {
	t.Helper()
	e, err := onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, LeaseTimeout: lease,
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// TestSingleCommitWritesTheKeyOnce: a single-commit execution writes the
// key's row once, completed at version 1 with one outbox event, in the
// commit of the handler's writes; retries replay it.
func TestSingleCommitWritesTheKeyOnce(t *testing.T) {
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	for i := range 3 {
		out, err := e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{"ok":true}`))
		require.NoError(t, err)
		require.Equal(t, i > 0, out.Replayed)
		require.Equal(t, `{"ok":true}`, string(out.Body))
	}
	require.Equal(t, 1, b.payments(t))
	var version, events int
	var updated bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT version, updated_at <> created_at FROM idempotency_keys WHERE key = 'k'`).Scan(&version, &updated))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE key = 'k'`).Scan(&events))
	require.Equal(t, 1, version)
	require.False(t, updated, "the row was written once")
	require.LessOrEqual(t, events, 1) // the relay of another test may have taken it
}

// TestSingleCommitTurnsDuplicatesAway hammers one key from many goroutines
// with no Redis in front, so only Postgres can keep them apart: one handler
// runs at a time (the advisory lock: no concurrent execution), exactly one
// commits (the business effect happens once), and every other call is
// turned away or replayed.
func TestSingleCommitTurnsDuplicatesAway(t *testing.T) {
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	var running, most atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // a handler that takes a while, so duplicates would overlap it
		return payment(201, `{}`)(ctx, tx)
	}
	for round := range 5 {
		key := fmt.Sprintf("k%d", round)
		var wg sync.WaitGroup
		var executed, replayed, inFlight atomic.Int32
		for range 16 {
			wg.Go(func() {
				out, err := e.Do(b.ctx, "s", key, nil, handler)
				switch {
				case err == nil && out.Replayed:
					replayed.Add(1)
				case err == nil:
					executed.Add(1)
				case isInFlight(err):
					inFlight.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		wg.Wait()
		require.Equal(t, int32(1), executed.Load(), "round %d", round)
		require.Equal(t, int32(15), replayed.Load()+inFlight.Load())
	}
	require.Equal(t, int32(1), most.Load(), "two handlers ran at once")
	require.Equal(t, 5, b.payments(t))
}

// TestSingleCommitFailureKeepsTheKey: a handler that fails rolls its writes
// back and leaves the key failed: another payload is refused
// (docs/invariants.md#a-key-is-not-reused-for-another-payload), a retry of
// the same one runs again (the two-phase way, as the key has a row) and
// completes.
func TestSingleCommitFailureKeepsTheKey(t *testing.T) {
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	boom := errors.New("boom")
	_, err := e.Do(b.ctx, "s", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := payment(201, `{}`)(ctx, tx); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{}, boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, b.payments(t))
	require.Equal(t, "failed", b.keyStatus(t, "k"))

	_, err = e.Do(b.ctx, "s", "k", []byte("other"), payment(201, `{}`))
	require.ErrorIs(t, err, onceonly.ErrKeyReused)
	require.Zero(t, b.payments(t))

	out, err := e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.False(t, out.Replayed)
	require.Equal(t, 1, b.payments(t))
	require.Equal(t, "completed", b.keyStatus(t, "k"))
}

// TestSingleCommitSetsKeepalives: the connection a single-commit execution
// runs on has the server's TCP keepalives on, for the session, so a client
// host that dies mid-transaction loses its lock within seconds (a crash
// blocks a key for one lease at most); set once, they outlast the
// transaction, failed or committed.
func TestSingleCommitSetsKeepalives(t *testing.T) {
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	keepalives := func(ctx context.Context, tx pgx.Tx) (string, error) {
		var idle, interval, count string
		err := tx.QueryRow(ctx, `SELECT current_setting('tcp_keepalives_idle'),
			current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count')`).Scan(&idle, &interval, &count)
		return idle + "/" + interval + "/" + count, err
	}
	for i, fail := range []bool{true, false, false} {
		var seen string
		_, err := e.Do(b.ctx, "s", fmt.Sprintf("k%d", i), nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			var err error
			if seen, err = keepalives(ctx, tx); err != nil || fail {
				return onceonly.Result{}, errors.Join(err, errors.New("boom"))
			}
			return payment(201, `{}`)(ctx, tx)
		})
		require.Equal(t, fail, err != nil, "execution %d: %v", i, err)
		require.Equal(t, "5/5/3", seen, "execution %d", i)
	}
}

func isInFlight(err error) bool {
	_, ok := onceonly.IsInFlight(err)
	return ok
}
