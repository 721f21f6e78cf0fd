package onceonly

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/exectx"
	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/internal/pgretry"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// singleCommit is the default mode: one round trip begins the execution's
// transaction, takes the key's lock (which every mode takes before it
// touches the key), looks for the key's row once the lock is held, and
// makes the execution's savepoint; the handler writes; one round trip
// writes the key's row, completed, and commits. A duplicate in flight is
// turned away by the lock (I4); Postgres ends a transaction that outlives
// the lease (I5). An execution that ends without a result rolls back to
// its savepoint and writes the key's failed row in its own transaction,
// still holding the lock (I13). A key that has a row goes the two-phase
// way.
type singleCommit struct{ e *Engine }

func (m singleCommit) check(ctx context.Context, ref keystate.Ref, fp string, owner keystate.Owner) (Outcome, string, bool, error) {
	return m.e.checkCache(ctx, ref, fp, owner)
}

// claim begins the transaction with the key's lock. A key that has a row
// (failed, expired, taken over) is claimed the two-phase way instead.
func (m singleCommit) claim(ctx context.Context, x *Execution) (keystate.Key, bool, error) {
	e := m.e
	var opened outbox.SingleBegin
	if err := e.store.LoadLockSecret(ctx, e.cfg.Pool); err != nil { // once: the key's lock id is derived from it
		e.releaseCache(ctx, x.ref, x.fence.Owner)
		return keystate.Key{}, false, fromStore(err)
	}
	// The lease runs from the BEGIN, sent once the transaction has its
	// connection: a wait for one (a pool run dry) does not eat it.
	x.tx = e.newTx(func(ctx context.Context, conn *pgx.Conn) error {
		x.claimedAt = time.Now()
		return e.store.PrepareSession(ctx, conn) // keepalives: Postgres finds a dead client host within the lease
	})
	err := x.tx.BeginWith(ctx, func(b *pgx.Batch) { e.store.QueueSingleBegin(b, x.ref, e.cfg.LeaseTimeout, &opened) })
	switch {
	case err != nil:
		x.rollback(ctx)
		e.releaseCache(ctx, x.ref, x.fence.Owner)
		return keystate.Key{}, false, e.fromClaim(err)
	case opened.HasRow:
		x.rollback(ctx)
		x.tx, x.mode = nil, twoPhase{e}
		return x.mode.claim(ctx, x)
	case !opened.Locked:
		x.rollback(ctx)
		return keystate.Key{}, false, inFlight(e.cfg.LeaseTimeout) // the holder's lease is not read: its bound
	}
	x.floor = opened.Floor
	return keystate.Key{Ref: x.ref, Owner: x.fence.Owner}, true, nil
}

// hold returns a lease that the execution's own transaction keeps: its
// idle timeout is the lease (single_begin), and while the handler runs, a
// third of the lease after the claim and every third after, the lease
// keeper proves the client alive on the transaction's connection when the
// handler leaves it idle (exectx.Tx.KeepAlive). So a slow but live
// execution is carried on to its one commit, and the transaction of a
// process that died or hangs ends within the lease (I5), its lock with it.
// One statement still ends at the lease (statement_timeout).
func (m singleCommit) hold(ctx context.Context, x *Execution, onLost func()) *lease.Lease {
	return m.e.leases.Kept(ctx, x.ref, x.fence.Owner, x.claimedAt, onLost, x.keepAlive)
}

func (singleCommit) tx(x *Execution) (pgx.Tx, error) { return x.transaction(), nil }

// sqlTx refuses: the engine runs single-commit executions only without
// Config.DB (modeFor).
func (singleCommit) sqlTx(context.Context, *Execution) (*sql.Tx, error) { return nil, ErrNoSQLDB }

// complete writes the key's row, completed, and commits in one round trip.
// A commit whose outcome is unknown (its connection broke) is settled
// before the caller is told anything (settleUnknown).
func (m singleCommit) complete(ctx context.Context, x *Execution, res Result) (keystate.Key, bool, error) {
	stored, committed, err := x.commitWith(ctx, func(b *pgx.Batch, stored *keystate.Key) {
		m.e.store.QueueSingleComplete(b, x.ref, x.fingerprint, keystate.Response(res), x.floor, stored)
	})
	if err == nil || errors.Is(err, ErrLeaseLost) {
		return stored, committed, err
	}
	return m.settleUnknown(ctx, x, err)
}

// settleUnknown settles the completion of x, whose COMMIT failed with
// err: the key's row, failed, if it has none and its lock is free (the
// commit did not land, and nothing else runs), else the key's row as it
// is. A row completed for x's request is the key's answer (I13): the
// commit landed — or, after x's transaction ended, another execution of
// the same request ran and committed — and x's caller gets the result,
// not an error.
func (m singleCommit) settleUnknown(ctx context.Context, x *Execution, err error) (keystate.Key, bool, error) {
	e := m.e
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_, written, ferr := m.failLate(ctx, x, false)
	if ferr == nil && !written {
		k, found, ferr := e.store.Get(ctx, e.cfg.Pool, x.ref)
		if ferr == nil && found && k.Status == keystate.Completed && k.Fingerprint == x.fingerprint {
			e.log.Info("a commit whose outcome was unknown had landed", "scope", x.ref.Scope, "key", x.ref.Key)
			return k, true, nil
		}
	}
	return keystate.Key{}, false, err
}

// release rolls back to the execution's savepoint and writes the key's
// row, failed, in the execution's transaction, which holds the key's lock
// (QueueSingleFail): a retry runs again, a request with another payload is
// refused (I3), and no other execution ran in between. When that
// transaction has ended already (Postgres ended it, its connection died),
// the row is written only if the key has none and its lock is free
// (failLate). An execution in this mode takes no step, so it is never
// handed off.
func (m singleCommit) release(ctx context.Context, x *Execution, end ending) (keystate.Key, bool, error) {
	countFailure := end != endFailed
	x.mu.Lock()
	tx := x.tx
	x.mu.Unlock()
	if tx != nil && !tx.Ended() {
		var k keystate.Key
		var written bool
		err := tx.CommitWith(ctx, func(b *pgx.Batch) {
			m.e.store.QueueSingleFail(b, x.ref, x.fingerprint, countFailure, &k, &written)
		})
		if err == nil {
			return k, written, nil
		}
		m.e.log.Debug("fail key in the execution's transaction; writing it after", "scope", x.ref.Scope, "key", x.ref.Key, "err", err)
	}
	k, written, err := m.failLate(ctx, x, countFailure)
	if err != nil || !written {
		return keystate.Key{}, false, fromStore(err)
	}
	return k, true, nil
}

// failLate writes the key's failed row after x's transaction ended, if the
// key has no row and its lock is free (outbox.SingleFail).
func (m singleCommit) failLate(ctx context.Context, x *Execution, countFailure bool) (k keystate.Key, written bool, err error) {
	e := m.e
	k, err = pgretry.OnLiveConnection(ctx, e.cfg.Pool, func() (keystate.Key, error) {
		var err error
		k, written, err = e.store.SingleFail(ctx, e.cfg.Pool, x.ref, x.fingerprint, countFailure)
		return k, err
	})
	return k, written, err
}

// promote commits x's claim in x's transaction, at x's first step (x.mu is
// held): the key's row, in progress under x's owner and lease, with its
// outbox event, then the COMMIT, in one round trip. The transaction holds
// the key's advisory lock until that COMMIT, and the row holds the key from
// it on, so no duplicate runs in between (I4). x goes on two-phase: its
// lease is renewed from the claim on, and the handler's writes go to a new
// transaction (Tx), which commits with the key's completion, fenced by the
// owner. When the key has a row by now (a two-phase claim took it: they take
// no advisory lock), x has lost it. When the round trip fails, whether the
// claim committed is unknown: x goes on two-phase all the same, so its end
// releases a row of its owner if there is one (its lease stays fixed).
func (m singleCommit) promote(ctx context.Context, x *Execution) (err error) {
	e := m.e
	ctx, span := e.startSpan(ctx, spanClaim)
	var claimed bool
	var k keystate.Key
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attrClaimed.Bool(claimed), attrVersion.Int64(k.Version))
		}
		endSpan(span, err)
	}()
	claimedAt := time.Now()
	err = x.tx.CommitWith(ctx, func(b *pgx.Batch) {
		e.store.QueueSinglePromote(b, x.ref, x.fingerprint, x.fence.Owner, e.cfg.LeaseTimeout, x.floor, &k, &claimed)
	})
	x.tx = nil
	switch {
	case errors.Is(err, outbox.ErrLeaseLost):
		return ErrLeaseLost // the key has a row by now (a distributed database's claim fails on it): as !claimed
	case err != nil:
		x.mode = twoPhase{e}
		return fromStore(fmt.Errorf("claim key at its first step: %w", err))
	case !claimed:
		return ErrLeaseLost // x stays single-commit: nothing of its to release
	}
	x.mode, x.fence, x.claimedAt = twoPhase{e}, Fence{Owner: k.Owner, Version: k.Version}, claimedAt
	e.leases.Renew(ctx, x.lease, claimedAt)
	return nil
}

// keepAlive keeps the execution's transaction alive while its handler runs
// (exectx.Tx.KeepAlive); once a step promoted it, there is none to keep,
// and the lease keeper renews the key's row instead.
func (x *Execution) keepAlive(ctx context.Context) error {
	if !x.mu.TryLock() {
		return lease.ErrKeepLater // a step (a promotion) or the handler's first Tx under way
	}
	_, single := x.mode.(singleCommit)
	tx := x.tx
	x.mu.Unlock()
	if !single || tx == nil {
		return lease.ErrKeptOtherwise
	}
	err := tx.KeepAlive(ctx)
	if errors.Is(err, exectx.ErrRowsOpen) {
		return lease.ErrKeepLater
	}
	return err
}

// keepsRow is false: the execution's transaction ended with Postgres, and
// left no row behind.
func (singleCommit) keepsRow() bool      { return false }
func (singleCommit) callerCommits() bool { return false }
