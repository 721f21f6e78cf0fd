package onceonly

// The errors callers branch on (errors.Is, or IsInFlight). The store's and
// the cache's own errors are translated into these where the engine calls
// them (fromStore); every message starts with "onceonly:".

import (
	"errors"
	"fmt"
	"time"

	"github.com/onceonly/onceonly/internal/canonjson"
	"github.com/onceonly/onceonly/internal/schemaver"
	"github.com/onceonly/onceonly/outbox"
)

// ErrKeyReused is returned when a key is sent again with another payload
// (another fingerprint). The handler did not run.
var ErrKeyReused = errors.New("onceonly: idempotency key was used with another payload")

// ErrUnavailable is returned when Postgres cannot be reached: nothing was
// decided, and the caller may retry.
var ErrUnavailable = errors.New("onceonly: idempotency store unavailable")

// ErrSchemaBehind is returned by New when the database's onceonly schema is
// missing or lacks a migration this release needs: run migrations.Up (or
// `api migrate up`) first. Its message names the fix and what New found.
// It is also returned, wrapping Postgres's error, by an execution whose
// statement met a table or function of the engine's that does not exist
// (the schema was rolled back or dropped after New, or
// Tuning.NoSchemaCheck was set): the broker consumers stop on it instead
// of redelivering every message. migrations.ErrSchemaBehind is the same
// error.
var ErrSchemaBehind = schemaver.ErrBehind

// ErrLeaseLost is returned when the execution's lease was taken over (or
// reaped) before it committed: its business writes were rolled back.
var ErrLeaseLost = errors.New("onceonly: lease lost before commit: business writes rolled back")

// ErrLeaseExpired is returned when the execution outran its lease and
// was stopped before it committed: its business writes were rolled back
// and the key failed (a retry runs again). Nothing took the key over.
// errors.Is(err, ErrLeaseLost) holds for it too.
var ErrLeaseExpired = fmt.Errorf("%w: the execution outran its lease; the key is failed and a retry runs again", ErrLeaseLost)

// ErrInvalidKey is returned for an idempotency key that is empty, longer
// than MaxKeyLength or holds a character outside 0x21..0x7E.
var ErrInvalidKey = errors.New("onceonly: idempotency key must be 1 to 255 printable ASCII characters without spaces")

// ErrInvalidScope is returned for a scope that is empty, longer than 255
// bytes, not valid UTF-8, or contains ':' or NUL (ValidateScope).
var ErrInvalidScope = errors.New("onceonly: scope must be 1 to 255 bytes of UTF-8 without ':' or NUL")

// ErrMissingKeyField is returned by KeyFromJSON when a path selects nothing,
// or a value that says nothing: null, "", [] or {}. A key derived without
// that field would be shared by every message that lacks it.
var ErrMissingKeyField = errors.New("onceonly: key field missing, null or empty")

// ErrNoExecution is returned by Tx and Step outside an execution.
var ErrNoExecution = errors.New("onceonly: no execution in this context")

// ErrStepAfterTx is returned by Step once the execution's transaction is
// open: an external call never runs while a Postgres transaction waits.
var ErrStepAfterTx = errors.New("onceonly: Step called after Tx: external calls run before the final transaction")

// ErrNoEffect is what a handler that ran steps wraps in its error when
// none of them had an effect the key must remember: each settled step is
// known to have done nothing (a payment gateway that answered it charged
// nothing). The key is then failed, and the failure counted, as for a
// handler that ran no step, so a retry runs again and Settle dead-letters
// a message after SettlePolicy.MaxFailures such failures. Without it, an
// error after a step hands the key off for a resumption (the step may have
// had an effect, I12); a step whose outcome is unknown hands it off even
// with it.
//
//	if charge.ID == "" {
//		return fmt.Errorf("gateway failed without charging: %w", onceonly.ErrNoEffect)
//	}
var ErrNoEffect = errors.New("onceonly: the execution's steps had no effect")

// ErrTxKind is returned by Tx and SQLTx when the execution's transaction
// is of the other kind: an execution writes through one transaction, pgx's
// (Tx, Do, DoTx) or database/sql's (SQLTx, DoSQL, DoSQLTx), the first it
// asks for.
var ErrTxKind = errors.New("onceonly: the execution's transaction is of the other kind: Tx (pgx) or SQLTx (database/sql), one per execution")

// ErrNoSQLDB is returned by SQLTx and DoSQL on an engine without
// Config.DB.
var ErrNoSQLDB = errors.New("onceonly: SQLTx and DoSQL need Config.DB")

// ErrUnnamedHandler is returned by Step in a handler that is not
// registered under a name: its execution could not be resumed.
var ErrUnnamedHandler = errors.New("onceonly: Step needs a named handler (MiddlewareOptions.Name or Engine.Register)")

// ErrKeyInProgress is returned by Purge for a key whose lease is held,
// unless forced: purging it would let a duplicate run beside it.
var ErrKeyInProgress = errors.New("onceonly: the key is in progress; purging it lets a duplicate run")

// ErrNoSuchKey is returned by Purge for a key that has no row.
var ErrNoSuchKey = errors.New("onceonly: no such key")

// InFlightError is returned while another execution holds the key.
type InFlightError struct {
	// RetryAfter is how long to wait before asking again: the rest of the
	// holder's lease, but at most MaxInFlightRetry (a live holder usually
	// finishes long before its lease would end, and a copy asked again
	// then is replayed at once) and at least a few milliseconds.
	RetryAfter time.Duration
	// LeaseRemaining is how long the holder's lease still runs: the longest
	// a caller may have to wait, when the holder died. When a single-commit
	// execution's transaction holds the key, whose lease is not read, it is
	// the lease's bound: Config.LeaseTimeout.
	LeaseRemaining time.Duration
}

// minInFlightRetry is the shortest InFlightError.RetryAfter: a lease about
// to end is asked about again once it has.
const minInFlightRetry = 10 * time.Millisecond

// inFlight returns the InFlightError of a key whose holder's lease runs
// for lease still.
func inFlight(lease time.Duration) *InFlightError {
	return &InFlightError{RetryAfter: min(max(lease, minInFlightRetry), MaxInFlightRetry), LeaseRemaining: max(lease, 0)}
}

// Error implements error.
func (e *InFlightError) Error() string {
	return fmt.Sprintf("onceonly: idempotency key in use by another request (retry after %s)", e.RetryAfter)
}

// IsInFlight reports whether err is an *InFlightError and returns it.
func IsInFlight(err error) (*InFlightError, bool) {
	var e *InFlightError
	ok := errors.As(err, &e)
	return e, ok
}

// ErrCommitByHandler is returned by Commit on the execution's transaction:
// the engine commits it, together with the key's completion, once the
// handler has returned its Result. DoTx's handler gets it from Commit and
// Rollback of its savepoint: the engine releases the savepoint with the
// key's completion (or rolls it back when the handler returns an error),
// and the caller commits.
var ErrCommitByHandler = errors.New("onceonly: the engine commits the execution's transaction; return the Result instead")

// unavailable wraps err, a failure of Postgres, in ErrUnavailable (once),
// or in ErrSchemaBehind when Postgres said a table or function of the
// engine's does not exist.
func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrSchemaBehind) {
		return err
	}
	if schemaver.MissingObject(err) {
		return fmt.Errorf("%w: %w", ErrSchemaBehind, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// fromStore translates an error of the key store: a lost lease is
// ErrLeaseLost, a key in progress ErrKeyInProgress, anything else a
// failure of Postgres (ErrUnavailable).
func fromStore(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, outbox.ErrLeaseLost):
		return ErrLeaseLost
	case errors.Is(err, outbox.ErrKeyInProgress):
		return ErrKeyInProgress
	}
	return unavailable(err)
}

// fromClaim translates an error of a claim: a key whose lock another
// transaction holds is in flight — a single-commit execution's, whose
// lease is not read: its bound, Config.LeaseTimeout — and anything else as
// fromStore does.
func (e *Engine) fromClaim(err error) error {
	if errors.Is(err, outbox.ErrKeyBusy) {
		return inFlight(e.cfg.LeaseTimeout)
	}
	return fromStore(err)
}

// ErrDuplicateName is returned (wrapped) by CanonicalJSON, KeyFromJSON and
// the middleware's JSON fingerprint for a JSON object that names a member
// twice: parsers disagree on which of the two counts, so no canonical form
// or key is derived from it.
var ErrDuplicateName = canonjson.ErrDuplicateName

// ErrInvalidMessage marks a message that can never run as it is: bad JSON,
// a missing field, no idempotency key. Wrap it (fmt.Errorf("%w: amount must
// be positive", onceonly.ErrInvalidMessage)) and Settle dead-letters the
// message with ReasonInvalid. Check a message before Do or Run, so an
// invalid one leaves no key behind.
var ErrInvalidMessage = errors.New("onceonly: invalid message")

// ErrNoRedisForDaemons is returned by Start when the engine has no Redis
// and the relay or the reconciler is not left out: both keep Redis in step
// with Postgres.
var ErrNoRedisForDaemons = errors.New("onceonly: the relay and the reconciler need Config.Redis (set Daemons.NoRelay and NoReconciler to run the resumer alone)")

// ErrNoRedis is returned by RepairCache on an engine that runs without
// Redis.
var ErrNoRedis = errors.New("onceonly: the engine runs without Redis")
