package onceonly

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/keystate"
	"github.com/onceonly/onceonly/internal/lease"
)

// DoTx is Do inside a transaction the caller owns: the claim, fn's writes
// and the key's completion all happen in tx (under a savepoint), and the
// caller commits — so a consumer that already holds a transaction (a
// watermill-sql handler's, River's JobCompleteTx pattern, a unit of work)
// makes the key part of it. The first call runs fn; later calls get its
// stored Result with Replayed set, from Redis when the relay delivered it,
// else from Postgres. payload is fingerprinted as in Do.
//
// What holds as with Do: fn's writes and the key's completion commit
// together or not at all (I1); a stored answer is replayed identically
// (I2); the same key with another payload returns ErrKeyReused. An error of
// fn, a panic, or a Result with a status that is not stored rolls back to
// the savepoint: fn's writes and the claim are undone, the key stays as it
// was (absent or failed, so retryable: I3), and tx remains usable — the
// caller may still commit its other work. fn's error comes back as an
// *ExecutionError whose Failures is 0 (not known): with the claim undone,
// no failure of the key is recorded, so Settle redelivers such a message
// without a limit of its own; bound it with the broker's (a delivery
// count, River's MaxAttempts).
//
// What changes: the key is held by the uncommitted row, not by a lease.
// Nobody sees the claim before the caller commits; a concurrent request for
// the same key waits in Postgres for that commit (then replays) or rollback
// (then claims), instead of a 409 — keep tx short. Nothing renews or
// fences a lease and no step can run (Step returns ErrNoExecution): a
// handler that calls systems outside Postgres needs Run. A dead caller's
// key is released by Postgres rolling back its transaction when the
// connection ends, not by the reaper. The engine cannot write the result
// through to Redis before the commit, so replays come from Postgres until
// the relay delivers the key's event: on its poll, or at the commit with
// Tuning.NotifyInTransaction and a listening relay.
func (e *Engine) DoTx(ctx context.Context, tx pgx.Tx, scope, key string, payload []byte, fn Handler) (Outcome, error) {
	m := &callerTx{e: e, outer: tx}
	// Unless complete released it, the savepoint is rolled back, whatever
	// the way out: the claim and fn's writes are undone, and tx stays
	// usable.
	defer m.rollback(ctx)
	return e.execute(ctx, m, scope, key, fingerprint{value: payloadFingerprint(payload)}, "",
		func() []byte { return payload }, withTx(fn))
}

// callerTx is the mode of DoTx: everything happens in a savepoint of the
// caller's transaction, and the caller commits.
type callerTx struct {
	e     *Engine
	outer pgx.Tx // the caller's transaction
	sp    pgx.Tx // the savepoint, once claim made it
}

// check reads Redis without claiming anything there: the key is held by
// the uncommitted row, which a provisional claim in Redis would outlive.
func (m *callerTx) check(ctx context.Context, ref keystate.Ref, fp string, _ keystate.Owner) (Outcome, string, bool, error) {
	return m.e.readCache(ctx, ref, fp)
}

// claim claims the key in a savepoint of the caller's transaction; unless
// complete releases it, the claim and the handler's writes are undone.
func (m *callerTx) claim(ctx context.Context, x *Execution) (keystate.Key, bool, error) {
	sp, err := m.outer.Begin(ctx)
	if err != nil {
		return keystate.Key{}, false, unavailable(fmt.Errorf("savepoint: %w", err))
	}
	m.sp = sp
	claim, err := m.e.store.Claim(ctx, sp, x.ref, x.fingerprint, x.fence.Owner, m.e.cfg.LeaseTimeout)
	if err != nil {
		_ = sp.Rollback(context.WithoutCancel(ctx))
		return keystate.Key{}, false, fromStore(err)
	}
	if !claim.Claimed {
		_ = sp.Rollback(context.WithoutCancel(ctx))
		return claim.Key, false, nil
	}
	x.fence = Fence{Owner: claim.Key.Owner, Version: claim.Key.Version}
	if claim.TookOver {
		x.by = byTakeover
	}
	return claim.Key, true, nil
}

// hold returns no lease: the uncommitted row holds the key until the
// caller's transaction ends.
func (*callerTx) hold(context.Context, *Execution, func()) *lease.Lease { return nil }

func (m *callerTx) tx(*Execution) (pgx.Tx, error) { return m.sp, nil }

// complete completes the key in the savepoint and releases it; the commit
// is the caller's, so there is nothing to write through yet.
func (m *callerTx) complete(ctx context.Context, x *Execution, res Result) (keystate.Key, bool, error) {
	stored, err := m.e.store.Complete(ctx, m.sp, x.ref, x.fence.Owner, res)
	if err != nil {
		_ = m.sp.Rollback(context.WithoutCancel(ctx))
		return keystate.Key{}, false, fromStore(fmt.Errorf("complete: %w", err))
	}
	if err := m.sp.Commit(ctx); err != nil {
		return keystate.Key{}, false, unavailable(fmt.Errorf("release savepoint: %w", err))
	}
	return stored, false, nil
}

// release rolls back to the savepoint, which undoes the claim: the key is
// as it was, and nothing changed that Redis should learn. No failure is
// counted either: the key's row is not written.
func (m *callerTx) release(ctx context.Context, _ *Execution, _ ending) (keystate.Key, bool, error) {
	m.rollback(ctx)
	return keystate.Key{}, false, nil
}

// rollback rolls back to the savepoint, if claim made one; a no-op once
// rolled back or released.
func (m *callerTx) rollback(ctx context.Context) {
	if m.sp != nil {
		_ = m.sp.Rollback(context.WithoutCancel(ctx))
	}
}

func (*callerTx) keepsRow() bool      { return false }
func (*callerTx) callerCommits() bool { return true }
