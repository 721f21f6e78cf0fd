package onceonly

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// DoSQL is Do for a handler that writes through database/sql
// (Config.DB): fn's writes go through a transaction on Config.DB that
// commits together with the key's completion, or not at all. Errors as
// for Do, and ErrNoSQLDB without Config.DB.
func (e *Engine) DoSQL(ctx context.Context, scope, key string, payload []byte, fn SQLHandler) (Outcome, error) {
	if err := e.canDo(fn == nil); err != nil {
		return Outcome{}, err
	}
	if e.cfg.DB == nil {
		return Outcome{}, ErrNoSQLDB
	}
	return e.execute(ctx, e.modeFor(), scope, key, fingerprint{value: payloadFingerprint(payload)}, "",
		func() []byte { return payload }, withSQLTx(fn))
}

// withSQLTx runs an SQLHandler as a Func: the transaction begins first.
func withSQLTx(fn SQLHandler) Func {
	return func(ctx context.Context, x *Execution) (Result, error) {
		tx, err := x.SQLTx(ctx)
		if err != nil {
			return Result{}, err
		}
		return fn(ctx, tx)
	}
}

// SQLTx returns the database/sql transaction of the execution running in
// ctx: in DoSQLTx the caller's; otherwise one on Config.DB, begun on first
// use (READ COMMITTED), in a handler of Do, Run, the middleware or a
// resumption alike. The handler writes its business rows through it; they
// commit together with the key's completion, or not at all. Never commit
// or roll it back: the engine does. Steps must come before it, and an
// execution has one transaction: after Tx, SQLTx returns ErrTxKind, and
// after SQLTx, Tx does.
func SQLTx(ctx context.Context) (*sql.Tx, error) {
	x, ok := ExecutionOf(ctx)
	if !ok {
		return nil, ErrNoExecution
	}
	return x.SQLTx(ctx)
}

// SQLTx returns the execution's database/sql transaction (see SQLTx). Its
// BEGIN is a round trip of its own; ctx bounds it, not the transaction,
// which the engine ends.
func (x *Execution) SQLTx(ctx context.Context) (*sql.Tx, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.mode.sqlTx(ctx, x)
}

// beginSQL begins x's transaction on Config.DB and hands x to the
// sqlTwoPhase mode; x.mu is held.
func (e *Engine) beginSQL(ctx context.Context, x *Execution) (*sql.Tx, error) {
	switch {
	case e.cfg.DB == nil:
		return nil, ErrNoSQLDB
	case x.tx != nil:
		return nil, ErrTxKind
	case !x.lease.Valid():
		return nil, ErrLeaseLost
	}
	// database/sql rolls a transaction back when the context it began
	// with ends; the engine commits this one after the handler's context
	// ended, and rolls it back itself (Execution.rollback). Only the BEGIN
	// is bounded by ctx.
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := e.cfg.DB.BeginTx(tctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if !stop() && err == nil {
		// ctx ended during the BEGIN: cancel rolls the transaction back.
		err = context.Cause(ctx)
	}
	if err != nil {
		return nil, unavailable(fmt.Errorf("begin: %w", err))
	}
	x.sqlTx, x.mode = tx, sqlTwoPhase{twoPhase{e}}
	return tx, nil
}

// sqlTwoPhase is the two-phase mode with the handler's writes in a
// database/sql transaction on Config.DB (x.sqlTx): the claim, the lease,
// steps and the release run on the engine's pgx pool as in twoPhase; the
// key's completion runs in the handler's transaction, fenced by the owner
// (it fails when the lease was lost, so nothing can commit the writes
// without the key), and commits with it. A two-phase execution becomes
// one when its handler asks for SQLTx (twoPhase.sqlTx).
type sqlTwoPhase struct{ twoPhase }

// tx refuses: the execution writes through database/sql.
func (sqlTwoPhase) tx(*Execution) (pgx.Tx, error) { return nil, ErrTxKind }

func (sqlTwoPhase) sqlTx(_ context.Context, x *Execution) (*sql.Tx, error) { return x.sqlTx, nil }

// complete sends the key's completion in the handler's transaction, then
// its COMMIT: two round trips (one with lib/pq's prepare more), where the
// pgx path sends them in one.
func (m sqlTwoPhase) complete(ctx context.Context, x *Execution, res Result) (keystate.Key, bool, error) {
	tx := x.sqlTx
	stored, err := m.e.store.Complete(ctx, outbox.SQLTx{Tx: tx}, x.ref, x.fence.Owner, keystate.Response(res))
	if err != nil {
		_ = tx.Rollback()
		if ended := m.e.endedByHandler(x.ref, err); ended != nil {
			return keystate.Key{}, false, ended
		}
		return keystate.Key{}, false, fromStore(fmt.Errorf("complete: %w", err))
	}
	if err := tx.Commit(); err != nil {
		return keystate.Key{}, false, unavailable(fmt.Errorf("commit: %w", err))
	}
	return stored, true, nil
}

// endedByHandler returns ErrCommitByHandler, and logs it, when err, of the
// key's completion in a database/sql transaction, says the handler ended
// that transaction itself (a *sql.Tx cannot refuse Commit and Rollback);
// nil otherwise.
func (e *Engine) endedByHandler(ref keystate.Ref, err error) error {
	if !errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	e.log.Error("the handler ended the execution's database/sql transaction itself; its writes may have committed without the key",
		"scope", ref.Scope, "key", ref.Key)
	return fmt.Errorf("%w: %w", ErrCommitByHandler, err)
}
