package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

type testBundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *outbox.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{
		ctx:   oncetest.Context(t),
		pool:  oncetest.DB(t),
		store: outbox.New(outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute}),
	}
}

var (
	ownerA = keystate.Owner{1}
	ownerB = keystate.Owner{2}
)

// events returns the versions of the outbox events db sees, oldest first.
func (b *testBundle) events(t *testing.T, db outbox.DB) []int64 {
	t.Helper()
	rows, err := db.Query(b.ctx, `SELECT version FROM outbox ORDER BY id`)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return versions
}

// expireLease moves the lease of a key into the past, through db.
func (b *testBundle) expireLease(t *testing.T, db outbox.DB, key string) {
	t.Helper()
	_, err := db.Exec(b.ctx, `UPDATE idempotency_keys SET lease_expires_at = now() - interval '1s' WHERE key = $1`, key)
	require.NoError(t, err)
}

func TestClaim(t *testing.T) {
	t.Parallel()

	t.Run("NewKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, keystate.InProgress, res.Key.Status)
		require.Equal(t, int64(1), res.Key.Version)
		require.Equal(t, ownerA, res.Key.Owner)
		require.InDelta(t, float64(time.Minute), float64(res.Key.LeaseRemaining), float64(time.Second))
		require.InDelta(t, float64(time.Hour), float64(res.Key.ExpiresIn), float64(time.Second))
		require.Equal(t, []int64{1}, b.events(t, b.pool))
	})

	t.Run("HeldKeyIsReported", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		for _, fp := range []string{"fp", "other"} {
			res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, fp, ownerB, time.Minute)
			require.NoError(t, err)
			require.False(t, res.Claimed)
			require.Equal(t, ownerA, res.Key.Owner)
			require.Equal(t, "fp", res.Key.Fingerprint)
		}
		require.Equal(t, []int64{1}, b.events(t, b.pool), "a refused claim writes no event")
	})

	t.Run("ExpiredLeaseIsTakenOver", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		b.expireLease(t, b.pool, "k")

		res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "other", ownerB, time.Minute)
		require.NoError(t, err)
		require.False(t, res.Claimed, "a takeover needs the same fingerprint")

		res, err = b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerB, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, int64(2), res.Key.Version)
		require.Equal(t, ownerB, res.Key.Owner)
		require.Equal(t, []int64{1, 2}, b.events(t, b.pool))
	})

	t.Run("FailedKeyIsReclaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		k, err := b.store.Fail(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, ownerA, true)
		require.NoError(t, err)
		require.Equal(t, keystate.Failed, k.Status)
		require.Equal(t, int64(2), k.Version)
		require.InDelta(t, float64(time.Minute), float64(k.ExpiresIn), float64(time.Second))

		res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerB, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, int64(3), res.Key.Version)
	})

	t.Run("ExpiredRowStartsANewLifecycle", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		_, err = b.store.Complete(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, ownerA, keystate.Response{Status: 201, ContentType: "application/json", Body: []byte("{}")})
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1s'`)
		require.NoError(t, err)

		res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "another payload", ownerB, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, int64(3), res.Key.Version, "versions keep counting so the cache never regresses")
		require.Zero(t, res.Key.Response.Status)
	})

	t.Run("CompletedKeyIsReported", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		resp := keystate.Response{Status: 402, ContentType: "application/json", Body: []byte(`{"x":1}`)}
		_, err = b.store.Complete(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, ownerA, resp)
		require.NoError(t, err)
		res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerB, time.Minute)
		require.NoError(t, err)
		require.False(t, res.Claimed)
		require.Equal(t, keystate.Completed, res.Key.Status)
		require.Equal(t, resp, res.Key.Response)
		// Refused, the claim neither wrote nor locked the row: replays
		// answered from Postgres do not queue behind each other.
		var xmax string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmax::text FROM idempotency_keys WHERE key = 'k'`).Scan(&xmax))
		require.Equal(t, "0", xmax)
		require.Equal(t, []int64{1, 2}, b.events(t, b.pool))
	})
}

// A claim commits on its own without waiting for the WAL flush, but never
// changes the durability of a caller's transaction.
func TestClaimKeepsCallerTransactionDurable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	syncCommit := func(db outbox.DB) string {
		var v string
		require.NoError(t, db.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&v))
		return v
	}
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, `SET synchronous_commit = on`) // test servers run with it off
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(b.ctx, `RESET synchronous_commit`) }()

	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	res, err := b.store.Claim(b.ctx, tx, keystate.Ref{Scope: "s", Key: "in-tx"}, "fp", ownerA, time.Minute)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, "on", syncCommit(tx))
	require.NoError(t, tx.Commit(b.ctx))

	res, err = b.store.Claim(b.ctx, conn, keystate.Ref{Scope: "s", Key: "own-commit"}, "fp", ownerA, time.Minute)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, "on", syncCommit(conn), "the setting must end with the claim's own commit")
}

// Many claims race for a key whose lease ran out: exactly one takes it
// over; the others are turned away by the key's lock or find the winner's
// row.
func TestTakeoverHammer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for round := range 5 {
		held, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", keystate.Owner{byte(round), 9}, time.Minute)
		require.NoError(t, err)
		if round == 0 {
			require.True(t, held.Claimed)
		}
		b.expireLease(t, b.pool, "k")
		var wg sync.WaitGroup
		var claimed sync.Map
		for i := range 40 {
			owner := keystate.Owner{byte(round), byte(i), 1}
			wg.Go(func() {
				res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", owner, time.Minute)
				if err != nil {
					if !errors.Is(err, outbox.ErrKeyBusy) {
						t.Error(err)
					}
					return
				}
				if res.Claimed {
					claimed.Store(i, res.Key.Version)
				}
			})
		}
		wg.Wait()
		n := 0
		claimed.Range(func(_, _ any) bool { n++; return true })
		require.Equal(t, 1, n, "round %d", round)
		b.expireLease(t, b.pool, "k")
	}
}

func TestCompleteIsFencedByOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx := oncetest.Tx(t, b.pool) // rolled back: nothing here must commit
	_, err := b.store.Claim(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Minute)
	require.NoError(t, err)
	b.expireLease(t, tx, "k")
	_, err = b.store.Claim(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerB, time.Minute)
	require.NoError(t, err)

	// The completion fails (so its transaction cannot commit): in a
	// savepoint, the transaction goes on.
	sp, err := tx.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.store.Complete(b.ctx, sp, keystate.Ref{Scope: "s", Key: "k"}, ownerA, keystate.Response{Status: 200})
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.NoError(t, sp.Rollback(b.ctx))
	_, err = b.store.Fail(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, ownerA, true)
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.ErrorIs(t, b.store.Heartbeat(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, ownerA, time.Minute), outbox.ErrLeaseLost)

	k, err := b.store.Complete(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, ownerB, keystate.Response{Status: 200, Body: []byte("ok")})
	require.NoError(t, err)
	require.Equal(t, int64(3), k.Version)
	require.Equal(t, []int64{1, 2, 3}, b.events(t, tx))
}

// TestTakeoverWaitsForTheHolder shows the fence under concurrency: a
// takeover that races a completing transaction either wins before it (and the
// old owner's commit fails) or sees the key completed.
func TestTakeoverRacesComplete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 20 {
		key := "k" + string(rune('a'+i))
		_, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: key}, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		b.expireLease(t, b.pool, key)

		var wg sync.WaitGroup
		var completeErr, takeoverErr error
		var takeover outbox.ClaimResult
		wg.Go(func() {
			completeErr = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				_, err := b.store.Complete(b.ctx, tx, keystate.Ref{Scope: "s", Key: key}, ownerA, keystate.Response{Status: 200})
				return err
			})
		})
		wg.Go(func() {
			takeover, takeoverErr = b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: key}, "fp", ownerB, time.Minute)
		})
		wg.Wait()
		require.NoError(t, takeoverErr)
		if takeover.Claimed {
			require.ErrorIs(t, completeErr, outbox.ErrLeaseLost)
		} else {
			require.NoError(t, completeErr)
			require.Equal(t, keystate.Completed, takeover.Key.Status)
		}
	}
}

func TestHeartbeatExtendsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx := oncetest.Tx(t, b.pool) // rolled back: nothing here must commit
	_, err := b.store.Claim(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, "fp", ownerA, time.Second)
	require.NoError(t, err)
	require.NoError(t, b.store.Heartbeat(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"}, ownerA, time.Hour))
	k, found, err := b.store.Get(b.ctx, tx, keystate.Ref{Scope: "s", Key: "k"})
	require.NoError(t, err)
	require.True(t, found)
	require.Greater(t, k.LeaseRemaining, 59*time.Minute)
	require.Equal(t, int64(1), k.Version)
	require.Equal(t, []int64{1}, b.events(t, tx))
}

func TestClaimHammer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var wg sync.WaitGroup
	claims := make(chan bool, 100)
	for i := range 100 {
		owner := keystate.Owner{byte(i), 1}
		wg.Go(func() {
			res, err := b.store.Claim(b.ctx, b.pool, keystate.Ref{Scope: "s", Key: "k"}, "fp", owner, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			claims <- res.Claimed
		})
	}
	wg.Wait()
	close(claims)
	n := 0
	for c := range claims {
		if c {
			n++
		}
	}
	require.Equal(t, 1, n)
}

// TestTransitionsNotifyTheRelays: a transition notifies the channel the
// relays listen on, unless DeferNotify, and Notify does as well.
func TestTransitionsNotifyTheRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	notified := func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return false
		}
		require.Equal(t, outbox.NotifyChannel, n.Channel)
		return true
	}

	ref := keystate.Ref{Scope: "s", Key: "k"}
	_, err = b.store.Claim(b.ctx, b.pool, ref, "fp", ownerA, time.Minute)
	require.NoError(t, err)
	require.True(t, notified(), "claim")
	deferred := outbox.New(outbox.Config{DeferNotify: true})
	_, err = deferred.Complete(b.ctx, b.pool, ref, ownerA, keystate.Response{Status: 201})
	require.NoError(t, err)
	require.False(t, notified(), "a completion with DeferNotify")
	require.NoError(t, deferred.Notify(b.ctx, b.pool))
	require.True(t, notified(), "Notify")
}

// TestFailures: a key counts the fails of failed handlers over its
// lifecycle; fails that are not the handler's, hand-offs, takeovers,
// reaps and completions leave the count as it is, and a new lifecycle
// starts again at 0.
func TestFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref := keystate.Ref{Scope: "s", Key: "k"}
	claim := func(owner keystate.Owner, fp string) outbox.ClaimResult {
		t.Helper()
		res, err := b.store.Claim(b.ctx, b.pool, ref, fp, owner, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		return res
	}
	fail := func(owner keystate.Owner, counted bool) int {
		t.Helper()
		k, err := b.store.Fail(b.ctx, b.pool, ref, owner, counted)
		require.NoError(t, err)
		return k.Failures
	}

	require.Zero(t, claim(ownerA, "fp").Key.Failures)
	require.Equal(t, 1, fail(ownerA, true))
	res := claim(ownerB, "fp")
	require.Equal(t, 1, res.Key.Failures)
	require.False(t, res.TookOver, "a failed key is claimed afresh")
	require.Equal(t, 2, fail(ownerB, true))
	claim(ownerA, "fp")
	require.Equal(t, 2, fail(ownerA, false), "a fail that is not the handler's is not counted")

	claim(ownerB, "fp")
	k, err := b.store.HandOff(b.ctx, b.pool, ref, ownerB)
	require.NoError(t, err)
	require.Equal(t, 2, k.Failures)
	res = claim(ownerA, "fp")
	require.True(t, res.TookOver, "a handed-off execution is taken over")
	require.Equal(t, 2, res.Key.Failures)

	b.expireLease(t, b.pool, "k")
	n, err := b.store.ReapLeases(b.ctx, b.pool, 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	k, _, err = b.store.Get(b.ctx, b.pool, ref)
	require.NoError(t, err)
	require.Equal(t, keystate.Failed, k.Status)
	require.Equal(t, 2, k.Failures, "a reaped lease is no failure of a handler")

	claim(ownerB, "fp")
	k, err = b.store.Complete(b.ctx, b.pool, ref, ownerB, keystate.Response{Status: 200})
	require.NoError(t, err)
	require.Equal(t, 2, k.Failures, "a completed key keeps the count of the failures before it")

	_, purged, err := b.store.Purge(b.ctx, b.pool, ref, false)
	require.NoError(t, err)
	require.True(t, purged)
	require.Zero(t, claim(ownerA, "another payload").Key.Failures, "a new lifecycle starts again at 0")
}
