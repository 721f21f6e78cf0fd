package onceonly

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/outbox"
)

// SQLHandler is a Handler that writes through a database/sql transaction
// (DoSQL, DoSQLTx): its writes commit together with the key's completion,
// or not at all. Never commit or roll tx back: the engine (DoSQL) or the
// caller (DoSQLTx) does.
type SQLHandler func(ctx context.Context, tx *sql.Tx) (Result, error)

// DoSQLTx is DoTx for a database/sql transaction, of any driver over
// Postgres (pgx's stdlib, lib/pq) and whatever builds on it (GORM, bun,
// ent, sqlx, sqlc): the claim, fn's writes and the key's completion all
// happen in tx (under a savepoint), and the caller commits. Its guarantees
// and limits are DoTx's: a concurrent request for the key waits in
// Postgres for the caller's commit, no Step can run, an error of fn rolls
// back to the savepoint and leaves tx usable. fn gets tx itself, and so
// does SQLTx(ctx) inside it. Config.DB is not needed.
//
// Unlike DoTx's savepoint, tx cannot refuse Commit and Rollback (*sql.Tx
// is a struct, not an interface to wrap): fn must call neither. A Commit
// commits fn's writes and the claim with the key still in progress (a
// later request takes it over and runs again); a Rollback undoes the
// caller's work too. Either way the key's completion then fails, and
// DoSQLTx returns ErrCommitByHandler (logged as an error).
//
// The engine's statements reach Postgres through database/sql: with pgx's
// stdlib each is one round trip (prepared once per connection); lib/pq
// sends a statement with arguments in two (prepare, then execute).
func (e *Engine) DoSQLTx(ctx context.Context, tx *sql.Tx, scope, key string, payload []byte, fn SQLHandler) (Outcome, error) {
	if err := e.canDo(fn == nil); err != nil {
		return Outcome{}, err
	}
	if tx == nil {
		return Outcome{}, errNoTx
	}
	out, err := e.inCallerTx(ctx, &sqlSavepoint{tx: tx}, scope, key, payload,
		func(ctx context.Context, _ *Execution) (Result, error) { return fn(ctx, tx) })
	return out, schemaError(err)
}

// sqlSavepoint is a savepoint of a database/sql transaction (DoSQLTx).
// Its name is fixed: a rollback releases it too, so a DoSQLTx inside the
// handler of another makes, and ends, a savepoint of its own before the
// outer one ends.
type sqlSavepoint struct {
	tx   *sql.Tx
	open bool // begun, and neither released nor rolled back
}

func (s *sqlSavepoint) begin(ctx context.Context) (outbox.Querier, error) {
	if _, err := s.tx.ExecContext(ctx, "SAVEPOINT onceonly"); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	s.open = true
	return outbox.SQLTx{Tx: s.tx}, nil
}

func (s *sqlSavepoint) release(ctx context.Context) error {
	s.open = false
	if _, err := s.tx.ExecContext(ctx, "RELEASE SAVEPOINT onceonly"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

func (s *sqlSavepoint) rollback(ctx context.Context) {
	if !s.open {
		return
	}
	s.open = false
	ctx = context.WithoutCancel(ctx)
	if _, err := s.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT onceonly"); err == nil {
		_, _ = s.tx.ExecContext(ctx, "RELEASE SAVEPOINT onceonly")
	}
}

func (*sqlSavepoint) pgx() (pgx.Tx, error)    { return nil, ErrTxKind }
func (s *sqlSavepoint) sql() (*sql.Tx, error) { return s.tx, nil }
