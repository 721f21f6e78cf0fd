package outbox_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

func TestClaimNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held := keystate.Ref{Scope: "s", Key: "held"}
	_, err := b.store.Claim(b.ctx, b.pool, held, "fp", ownerA, time.Minute)
	require.NoError(t, err)

	reqs := []outbox.ClaimRequest{
		{Ref: keystate.Ref{Scope: "s", Key: "b"}, Fingerprint: "fp-b", Owner: keystate.Owner{10}},
		{Ref: held, Fingerprint: "fp", Owner: keystate.Owner{11}},
		{Ref: keystate.Ref{Scope: "s", Key: "a"}, Fingerprint: "fp-a", Owner: keystate.Owner{12}},
		{Ref: keystate.Ref{Scope: "s", Key: "a"}, Fingerprint: "fp-a", Owner: keystate.Owner{13}}, // twice in the batch
	}
	results, err := b.store.ClaimNew(b.ctx, b.pool, reqs, time.Minute, time.Second)
	require.NoError(t, err)
	require.Len(t, results, len(reqs))
	for i, want := range []bool{true, false, true, false} {
		require.Equal(t, want, results[i].Claimed, "request %d", i)
		if want {
			k := results[i].Key
			require.Equal(t, reqs[i].Ref, k.Ref)
			require.Equal(t, reqs[i].Owner, k.Owner)
			require.Equal(t, reqs[i].Fingerprint, k.Fingerprint)
			require.Equal(t, keystate.InProgress, k.Status)
			require.Equal(t, int64(1), k.Version)
			require.InDelta(t, float64(time.Minute), float64(k.LeaseRemaining), float64(time.Second))
		}
	}
	require.Equal(t, []int64{1, 1, 1}, b.events(t, b.pool), "one event per claimed key")

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.store.ClaimNew(b.ctx, tx, reqs[:1], time.Minute, time.Second)
	require.Error(t, err, "a batch runs its own transaction")
	require.NoError(t, tx.Rollback(b.ctx))

	// The keys left out finish their claims alone, from their rows.
	res, err := b.store.ClaimHeld(b.ctx, b.pool, held, "fp", keystate.Owner{11}, time.Minute)
	require.NoError(t, err)
	require.False(t, res.Claimed)
	require.Equal(t, ownerA, res.Key.Owner)
	res, err = b.store.ClaimHeld(b.ctx, b.pool, reqs[3].Ref, "fp-a", keystate.Owner{13}, time.Minute)
	require.NoError(t, err)
	require.False(t, res.Claimed)
	require.Equal(t, keystate.Owner{12}, res.Key.Owner)
}

// Batches that meet on the same new keys wait for each other; they insert
// in key order, so they never wait in a circle. Each round, goroutines send
// the same new keys, each in an order of its own, at once: without the
// ORDER BY of claim_batch.sql, Postgres finds deadlocks (40P01) here.
func TestClaimNewNeverDeadlocks(t *testing.T) {
	t.Parallel()
	exerciseNeverDeadlocks(t, setup(t))
}

// exerciseNeverDeadlocks is TestClaimNewNeverDeadlocks on b.
func exerciseNeverDeadlocks(t *testing.T, b *testBundle) {
	t.Helper()
	const rounds, senders, keys = 40, 6, 12
	for round := range rounds {
		start := make(chan struct{})
		errs := make([]error, senders)
		claimed := make([]int, senders)
		var wg sync.WaitGroup
		for s := range senders {
			reqs := make([]outbox.ClaimRequest, keys)
			for i, k := range rand.Perm(keys) {
				reqs[i] = outbox.ClaimRequest{
					Ref:         keystate.Ref{Scope: "s", Key: fmt.Sprintf("r%d-k%d", round, k)},
					Fingerprint: "fp", Owner: keystate.NewOwner(),
				}
			}
			wg.Go(func() {
				<-start
				results, err := b.store.ClaimNew(b.ctx, b.pool, reqs, time.Minute, 10*time.Second)
				errs[s] = err
				for _, r := range results {
					if r.Claimed {
						claimed[s]++
					}
				}
			})
		}
		close(start)
		wg.Wait()
		total := 0
		for s := range senders {
			require.NoError(t, errs[s], "round %d, sender %d", round, s)
			total += claimed[s]
		}
		require.Equal(t, keys, total, "round %d: each key claimed once", round)
	}
}

// A key whose lock another transaction holds (it inserted the key and has
// not committed) comes back unclaimed at once; the batch's other keys are
// claimed.
func TestClaimNewSkipsHeldKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	open := keystate.Ref{Scope: "s", Key: "open"}
	_, err = b.store.Claim(b.ctx, tx, open, "fp", ownerA, time.Minute) // inserted, not committed
	require.NoError(t, err)

	began := time.Now()
	res, err := b.store.ClaimNew(b.ctx, b.pool, []outbox.ClaimRequest{
		{Ref: keystate.Ref{Scope: "s", Key: "free"}, Fingerprint: "fp", Owner: ownerB},
		{Ref: open, Fingerprint: "fp", Owner: keystate.Owner{3}},
	}, time.Minute, time.Minute)
	require.NoError(t, err)
	require.Less(t, time.Since(began), 3*time.Second, "no wait for the open transaction")
	require.True(t, res[0].Claimed)
	require.False(t, res[1].Claimed)
	_, err = b.store.ClaimHeld(b.ctx, b.pool, open, "fp", keystate.Owner{3}, time.Minute)
	require.ErrorIs(t, err, outbox.ErrKeyBusy, "claimed alone, it is turned away by the lock")
}

// On a distributed database (Citus), where the claims take no key lock, a
// wait past the lock timeout for a transaction that inserted one of the
// keys fails the batch instead of holding up its other keys; lock_timeout
// goes by SET LOCAL there.
func TestClaimNewByScopeGivesUpWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.store = outbox.New(outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute, DeferNotify: true,
		Distribution: outbox.ByScope})
	exerciseGivesUpWaiting(t, b)
}

// exerciseGivesUpWaiting is TestClaimNewByScopeGivesUpWaiting on b, whose
// store defers its notifications (with them, no lock_timeout is set).
func exerciseGivesUpWaiting(t *testing.T, b *testBundle) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	open := keystate.Ref{Scope: "s", Key: "open"}
	_, err = b.store.Claim(b.ctx, tx, open, "fp", ownerA, time.Minute) // inserted, not committed
	require.NoError(t, err)

	began := time.Now()
	_, err = b.store.ClaimNew(b.ctx, b.pool, []outbox.ClaimRequest{
		{Ref: keystate.Ref{Scope: "s", Key: "free"}, Fingerprint: "fp", Owner: ownerB},
		{Ref: open, Fingerprint: "fp", Owner: keystate.Owner{3}},
	}, time.Minute, 100*time.Millisecond)
	require.ErrorContains(t, err, "55P03")
	require.Less(t, time.Since(began), 3*time.Second, "the lock timeout, not a 5 s default, ended the wait")
	require.Empty(t, b.events(t, b.pool), "the failed batch claimed nothing")
}

// A claim whose earlier try committed but lost its answer (a connection
// that died after the commit, a batch that failed after it) finds its own
// row: it holds the key, instead of waiting a lease for itself.
func TestClaimFindsItsOwnRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref := keystate.Ref{Scope: "s", Key: "own"}
	results, err := b.store.ClaimNew(b.ctx, b.pool, []outbox.ClaimRequest{{Ref: ref, Fingerprint: "fp", Owner: ownerA}}, time.Minute, time.Second)
	require.NoError(t, err)
	require.True(t, results[0].Claimed)

	res, err := b.store.Claim(b.ctx, b.pool, ref, "fp", ownerA, time.Minute) // the try again
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, results[0].Key.Version, res.Key.Version, "the same claim, not a new one")
	res, err = b.store.Claim(b.ctx, b.pool, ref, "fp", ownerB, time.Minute)
	require.NoError(t, err)
	require.False(t, res.Claimed, "another owner is still turned away")
}
