package onceonly

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/keystate"
)

// A mode is one way for an execution to hold its key while its handler
// runs and to settle the key after. The engine's flow (execute, run) is
// the same for every mode; what differs lives in one type per mode:
//
//   - twoPhase (twophase.go): the claim commits on its own, under a lease
//     the engine renews; the handler's writes commit with the completion.
//     Steps, fencing, heartbeats and resumption need it.
//   - singleCommit (single.go): one transaction takes the key's lock, holds
//     the handler's writes and writes the key's row, completed. Every
//     execution begins so (unless Config.TwoPhase); its first step commits
//     its claim and hands it to twoPhase.
//   - callerTx (dotx.go): the claim, the handler's writes and the
//     completion run in a savepoint of the caller's transaction, which the
//     caller commits (DoTx; DoSQLTx, sqltx.go, for database/sql's).
//   - sqlTwoPhase (sqldb.go): two-phase, with the handler's writes and the
//     completion in a database/sql transaction on Config.DB (SQLTx); a
//     two-phase execution turns into it when its handler asks for SQLTx.
//
// A new mode is one new type implementing mode, picked where its entry
// point makes an execution.
type mode interface {
	// check asks Redis about ref for a request of fingerprint fp, before
	// Postgres is asked and before any execution is made (a replay needs
	// none); done is true when Redis answered the request.
	check(ctx context.Context, ref keystate.Ref, fp string, owner keystate.Owner) (out Outcome, outcome string, done bool, err error)
	// claim takes x's key, setting x's fence, recovery points and
	// claimedAt (the time the claim was sent: the lease runs from later),
	// and reports true; or it reports false with the row of the execution that
	// holds the key (held). An error is Postgres's, or an *InFlightError.
	// A mode may hand x to another mode here (x.mode).
	claim(ctx context.Context, x *Execution) (held keystate.Key, claimed bool, err error)
	// hold returns the lease x runs under, from x.claimedAt; onLost stops
	// x's handler. A nil lease never ends: the key is held otherwise.
	hold(ctx context.Context, x *Execution, onLost func()) *lease.Lease
	// tx returns the transaction the handler writes through, or an error
	// when the mode's transaction is not a pgx.Tx.
	tx(x *Execution) (pgx.Tx, error)
	// sqlTx returns the database/sql transaction the handler writes
	// through, beginning it if the mode does, or an error when the mode's
	// transaction is not a *sql.Tx; x.mu is held. A mode may hand x to
	// another mode here (x.mode).
	sqlTx(ctx context.Context, x *Execution) (*sql.Tx, error)
	// complete stores res as the key's answer with the handler's writes.
	// stored is the key's new state once committed (committed true); while
	// the commit is still to come (the caller's), committed is false.
	complete(ctx context.Context, x *Execution, res Result) (stored keystate.Key, committed bool, err error)
	// release fails x's key, or hands it off for a resumption, as end
	// says, once the handler's writes are rolled back. changed is the key's
	// new state (released true); released is false, with a nil error, when
	// nothing of x's was left to release.
	release(ctx context.Context, x *Execution, end ending) (changed keystate.Key, released bool, err error)
	// keepsRow reports whether x's key has a committed row of x's that
	// holds it until its lease ends, so a release Postgres did not take is
	// tried again in the background (releaseLater).
	keepsRow() bool
	// callerCommits reports whether the caller, not the engine, commits.
	callerCommits() bool
}

// modeFor returns the mode of a new execution of an entry point that
// leaves the commit to the engine: a single commit, which its first step
// promotes to two-phase (singleCommit.promote), unless Config.TwoPhase asks
// for two-phase from the start. With Config.DB, any handler may ask for
// SQLTx, which a single-commit execution cannot give (its key is held by
// the pgx transaction it began before the handler ran): all run two-phase.
func (e *Engine) modeFor() mode {
	if e.cfg.TwoPhase || e.cfg.DB != nil {
		return twoPhase{e}
	}
	return singleCommit{e}
}
