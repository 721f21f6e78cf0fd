package onceonly

import (
	"errors"
	"fmt"
	"time"
)

// ErrKeyReused is returned when a key is sent again with another payload
// (another fingerprint). The handler did not run.
var ErrKeyReused = errors.New("idempotency key was used with another payload")

// ErrUnavailable is returned when Postgres cannot be reached: nothing was
// decided, and the caller may retry.
var ErrUnavailable = errors.New("idempotency store unavailable")

// ErrLeaseLost is returned when the execution's lease was taken over (or
// reaped) before it committed: its business writes were rolled back.
var ErrLeaseLost = errors.New("lease lost before commit: business writes rolled back")

// InFlightError is returned while another execution holds the key.
type InFlightError struct {
	// RetryAfter is how long the current lease still runs.
	RetryAfter time.Duration
}

// Error implements error.
func (e *InFlightError) Error() string {
	return fmt.Sprintf("idempotency key in use by another request (retry after %s)", e.RetryAfter)
}

// IsInFlight reports whether err is an *InFlightError and returns it.
func IsInFlight(err error) (*InFlightError, bool) {
	var e *InFlightError
	ok := errors.As(err, &e)
	return e, ok
}

// ErrCommitByHandler is returned by Commit on the execution's transaction:
// the engine commits it, together with the key's completion, once the
// handler has returned its Result.
var ErrCommitByHandler = errors.New("onceonly: the engine commits the execution's transaction; return the Result instead")

// unavailable wraps err, a failure of Postgres, in ErrUnavailable (once).
func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
