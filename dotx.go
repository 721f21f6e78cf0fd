package onceonly

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// DoTx is Do inside a transaction the caller owns: the claim, fn's writes
// and the key's completion all happen in tx (under a savepoint), and the
// caller commits — so a consumer that already holds a transaction (a
// watermill-sql handler's, River's JobCompleteTx pattern, a unit of work)
// makes the key part of it. The first call runs fn; later calls get its
// stored Result with Replayed set, from Redis when the relay delivered it,
// else from Postgres. payload is fingerprinted as in Do. fn writes through
// the savepoint, whose Commit and Rollback return ErrCommitByHandler (the
// engine ends it); its Begin makes a nested savepoint as usual.
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
// What changes: the key is held by the key's lock, which tx holds from the
// claim until the caller commits or rolls back, and by the uncommitted row,
// not by a lease. Nobody sees the claim before the caller commits; a
// concurrent request for the same key, of any mode, is turned away
// (*InFlightError, 409) until then — keep tx short. Nothing renews or
// fences a lease and no step can run (Step returns ErrNoExecution): a
// handler that calls systems outside Postgres needs Run. A dead caller's
// key is released by Postgres rolling back its transaction when the
// connection ends, not by the reaper. The engine cannot write the result
// through to Redis before the commit, so replays come from Postgres until
// the relay delivers the key's event: on its poll, or at the commit with
// Tuning.NotifyInTransaction and a listening relay.
func (e *Engine) DoTx(ctx context.Context, tx pgx.Tx, scope, key string, payload []byte, fn Handler) (Outcome, error) {
	if err := e.canDo(fn == nil); err != nil {
		return Outcome{}, err
	}
	if tx == nil {
		return Outcome{}, errNoTx
	}
	out, err := e.inCallerTx(ctx, &pgxSavepoint{outer: tx}, scope, key, payload, withTx(fn))
	return out, schemaError(err)
}

// inCallerTx runs fn once for (scope, key) in sp, a savepoint of the
// caller's transaction (DoTx, DoSQLTx).
func (e *Engine) inCallerTx(ctx context.Context, sp savepoint, scope, key string, payload []byte, fn Func) (Outcome, error) {
	m := &callerTx{e: e, sp: sp}
	// Unless complete released it, the savepoint is rolled back, whatever
	// the way out: the claim and fn's writes are undone, and the caller's
	// transaction stays usable.
	defer sp.rollback(ctx)
	return e.execute(ctx, m, scope, key, fingerprint{value: payloadFingerprint(payload)}, "",
		func() []byte { return payload }, fn)
}

// callerTx is the mode of DoTx and DoSQLTx: everything happens in a
// savepoint of the caller's transaction, and the caller commits.
type callerTx struct {
	e  *Engine
	sp savepoint
	db outbox.Querier // the key's statements run on it, once claim made the savepoint
}

// savepoint is a savepoint of the caller's transaction: pgx's
// (pgxSavepoint) or database/sql's (sqlSavepoint, sqltx.go).
type savepoint interface {
	// begin makes the savepoint; the key's statements then run on db. Its
	// error says what failed ("savepoint: …").
	begin(ctx context.Context) (db outbox.Querier, err error)
	// release releases the savepoint, keeping what ran since begin. Its
	// error says what failed ("release savepoint: …").
	release(ctx context.Context) error
	// rollback rolls back to the savepoint, even when ctx has ended; a
	// no-op unless begun and neither released nor rolled back.
	rollback(ctx context.Context)
	// pgx returns the transaction a Handler writes through, or ErrTxKind.
	pgx() (pgx.Tx, error)
	// sql returns the transaction an SQLHandler writes through, or
	// ErrTxKind.
	sql() (*sql.Tx, error)
}

// check reads Redis without claiming anything there: the key is held by
// the uncommitted row, which a provisional claim in Redis would outlive.
func (m *callerTx) check(ctx context.Context, ref keystate.Ref, fp string, _ keystate.Owner) (Outcome, string, bool, error) {
	return m.e.readCache(ctx, ref, fp)
}

// claim claims the key in a savepoint of the caller's transaction; unless
// complete releases it, the claim and the handler's writes are undone.
func (m *callerTx) claim(ctx context.Context, x *Execution) (keystate.Key, bool, error) {
	db, err := m.sp.begin(ctx)
	if err != nil {
		return keystate.Key{}, false, unavailable(err)
	}
	m.db = db
	claim, err := m.e.store.Claim(ctx, db, x.ref, x.fingerprint, x.fence.Owner, m.e.cfg.LeaseTimeout)
	if err != nil {
		m.sp.rollback(ctx)
		return keystate.Key{}, false, m.e.fromClaim(err)
	}
	if !claim.Claimed {
		m.sp.rollback(ctx)
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

func (m *callerTx) tx(*Execution) (pgx.Tx, error) { return m.sp.pgx() }

func (m *callerTx) sqlTx(context.Context, *Execution) (*sql.Tx, error) { return m.sp.sql() }

// complete completes the key in the savepoint and releases it; the commit
// is the caller's, so there is nothing to write through yet.
func (m *callerTx) complete(ctx context.Context, x *Execution, res Result) (keystate.Key, bool, error) {
	stored, err := m.e.store.Complete(ctx, m.db, x.ref, x.fence.Owner, keystate.Response(res))
	if err != nil {
		m.sp.rollback(ctx)
		if ended := m.e.endedByHandler(x.ref, err); ended != nil {
			return keystate.Key{}, false, ended // DoSQLTx's fn ended tx
		}
		return keystate.Key{}, false, fromStore(fmt.Errorf("complete: %w", err))
	}
	if err := m.sp.release(ctx); err != nil {
		return keystate.Key{}, false, unavailable(err)
	}
	return stored, false, nil
}

// release rolls back to the savepoint, which undoes the claim: the key is
// as it was, and nothing changed that Redis should learn. No failure is
// counted either: the key's row is not written.
func (m *callerTx) release(ctx context.Context, _ *Execution, _ ending) (keystate.Key, bool, error) {
	m.sp.rollback(ctx)
	return keystate.Key{}, false, nil
}

func (*callerTx) keepsRow() bool      { return false }
func (*callerTx) callerCommits() bool { return true }

// pgxSavepoint is a savepoint of a pgx transaction (DoTx): a pseudo nested
// transaction, which the handler writes through.
type pgxSavepoint struct {
	outer pgx.Tx // the caller's transaction
	sp    pgx.Tx // the savepoint, once begun
}

func (s *pgxSavepoint) begin(ctx context.Context) (outbox.Querier, error) {
	sp, err := s.outer.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	s.sp = sp
	return sp, nil
}

func (s *pgxSavepoint) release(ctx context.Context) error {
	if err := s.sp.Commit(ctx); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// rollback rolls back to the savepoint; pgx makes it a no-op once rolled
// back or released.
func (s *pgxSavepoint) rollback(ctx context.Context) {
	if s.sp != nil {
		_ = s.sp.Rollback(context.WithoutCancel(ctx))
	}
}

func (s *pgxSavepoint) pgx() (pgx.Tx, error) { return handlerTx{s.sp}, nil }
func (*pgxSavepoint) sql() (*sql.Tx, error)  { return nil, ErrTxKind }

// handlerTx is the savepoint as DoTx's handler sees it: its Commit would
// release the savepoint with the key still in progress (the caller's
// commit then keeping the effect without the key's completion), its
// Rollback would undo the claim under the engine, so both refuse with
// ErrCommitByHandler; the engine releases or rolls back the savepoint
// itself. Everything else, Begin (a nested savepoint, which commits and
// rolls back as usual) included, is the savepoint's.
type handlerTx struct{ pgx.Tx }

// Commit refuses: the engine releases the savepoint with the key's
// completion, and the caller commits.
func (handlerTx) Commit(context.Context) error { return ErrCommitByHandler }

// Rollback refuses: a handler that returns an error has the savepoint
// rolled back by the engine.
func (handlerTx) Rollback(context.Context) error { return ErrCommitByHandler }
