package onceonly

// Settling a message: what a consumer of an at-least-once broker does with
// a delivery once Do, Run or DoTx answered it. Every broker package
// (onceriver, onceamqp, oncenats, oncekafka, oncewatermill) maps a
// Settlement onto its broker's own verbs, so the mapping from outcome to
// ack, delayed redelivery or dead letter is written once, here.

import (
	"errors"
	"fmt"
	"time"
)

// Disposition is what a consumer does with a delivery.
type Disposition int

// The dispositions of a delivery.
const (
	// Ack acknowledges the delivery: its effect is committed, by this
	// execution or an earlier copy's.
	Ack Disposition = iota + 1
	// Retry leaves the delivery to be delivered again after
	// Settlement.After: another copy holds the key, the store was down, the
	// handler failed (and may succeed later), or the key was handed off to
	// a resumption whose outcome is not known yet.
	Retry
	// DeadLetter parks the delivery with Settlement.Reason: it can never
	// succeed as it is.
	DeadLetter
)

// String returns the disposition's name: ack, retry or dead_letter.
func (d Disposition) String() string {
	switch d {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return fmt.Sprintf("disposition(%d)", int(d))
}

// The reasons a delivery is dead-lettered (Settlement.Reason), as the
// brokers' dead letters carry them.
const (
	// ReasonReused: the key was used before with another payload
	// (ErrKeyReused).
	ReasonReused = "reused"
	// ReasonInvalid: the message or its key is malformed (ErrInvalidMessage,
	// ErrInvalidKey, ErrInvalidScope, ErrMissingKeyField).
	ReasonInvalid = "invalid"
	// ReasonFailed: SettlePolicy.MaxFailures executions of the key ended
	// failed.
	ReasonFailed = "failed"
)

// Settlement is the disposition of one delivery and why.
type Settlement struct {
	// Disposition says what to do with the delivery.
	Disposition Disposition
	// After is how long to wait before the delivery comes again (Retry).
	After time.Duration
	// Reason names why the delivery is dead-lettered (DeadLetter): one of
	// ReasonReused, ReasonInvalid, ReasonFailed.
	Reason string
	// Failures counts the executions of the key that ended failed, this
	// one included (0 when none did, or when the answer did not say).
	Failures int
	// Outcome is the engine's answer when there was one (Ack).
	Outcome Outcome
	// Err is the error that led to Retry or DeadLetter; nil for Ack.
	Err error
}

// Defaults of SettlePolicy.
const (
	// DefaultMaxFailures is SettlePolicy.MaxFailures when unset.
	DefaultMaxFailures = 5
	// DefaultMinBackoff and DefaultMaxBackoff bound the redelivery delay
	// after a failed execution when SettlePolicy leaves them unset.
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = time.Minute
	// MaxInFlightRetry caps InFlightError.RetryAfter, the middleware's
	// Retry-After and the delay before a copy of a message whose key
	// another execution holds comes again: the holder may finish long
	// before its lease would end, and the copy should then replay at once.
	MaxInFlightRetry = time.Second
)

// SettlePolicy turns the engine's answers into settlements. The zero value
// uses the defaults above.
type SettlePolicy struct {
	// MaxFailures is how many executions of a key may end failed before a
	// delivery of it is dead-lettered (ReasonFailed). Crashes, in-flight
	// answers and unavailable stores do not count. A later copy of a
	// dead-lettered key runs again, once. Zero means DefaultMaxFailures.
	MaxFailures int
	// MinBackoff and MaxBackoff bound the delay after a failed execution:
	// MinBackoff doubled for every earlier failure, at most MaxBackoff.
	// Zero means DefaultMinBackoff, DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// Settle settles a delivery with the zero SettlePolicy.
func Settle(out Outcome, err error) Settlement {
	return SettlePolicy{}.Settle(out, err)
}

// Settle turns the answer of Do, Run or DoTx (or an error of the consumer's
// own, such as one wrapping ErrInvalidMessage) into a settlement:
//
//   - no error: Ack (a first execution or a replay alike). That includes
//     a Result whose status is not stored (Config.ShouldStore): the key is
//     failed and the failure counted, but the Result is an answer, which
//     Outcome.Status carries. A handler run for a consumer reports a
//     failure with an error instead, so that its delivery comes again;
//   - ErrKeyReused: DeadLetter, ReasonReused;
//   - ErrInvalidMessage, ErrInvalidKey, ErrInvalidScope, ErrMissingKeyField:
//     DeadLetter, ReasonInvalid;
//   - *InFlightError: Retry after its RetryAfter, at most MaxInFlightRetry;
//   - *ExecutionError handed off: Retry after MinBackoff (the key settles by
//     a resumption or this redelivery; nothing failed);
//   - *ExecutionError failed: Retry with backoff, or DeadLetter
//     (ReasonFailed) once MaxFailures executions of the key failed; a count
//     of 0 (not known) always retries;
//   - anything else (ErrUnavailable, ErrLeaseLost, a canceled context):
//     Retry after MinBackoff, counted as no failure. That includes
//     ErrSchemaBehind and ErrNotMade, which no message is to blame for and
//     none can get past: the broker packages stop on them (a consumer of
//     your own should too) rather than redeliver every message.
func (p SettlePolicy) Settle(out Outcome, err error) Settlement {
	if err == nil {
		return Settlement{Disposition: Ack, Outcome: out}
	}
	if errors.Is(err, ErrKeyReused) {
		return Settlement{Disposition: DeadLetter, Reason: ReasonReused, Err: err}
	}
	if invalid(err) {
		return Settlement{Disposition: DeadLetter, Reason: ReasonInvalid, Err: err}
	}
	if inFlight, ok := IsInFlight(err); ok {
		return Settlement{Disposition: Retry, After: min(max(inFlight.RetryAfter, 0), MaxInFlightRetry), Err: err}
	}
	var failed *ExecutionError
	if errors.As(err, &failed) && !failed.HandedOff {
		if failed.Failures >= p.maxFailures() {
			return Settlement{Disposition: DeadLetter, Reason: ReasonFailed, Failures: failed.Failures, Err: err}
		}
		return Settlement{Disposition: Retry, After: p.Backoff(failed.Failures), Failures: failed.Failures, Err: err}
	}
	return Settlement{Disposition: Retry, After: p.minBackoff(), Err: err}
}

// Backoff returns the delay before a delivery whose key failed failures
// times comes again: MinBackoff doubled for every failure after the first,
// at most MaxBackoff.
func (p SettlePolicy) Backoff(failures int) time.Duration {
	d, ceiling := p.minBackoff(), p.maxBackoff()
	for i := 1; i < failures && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

func (p SettlePolicy) maxFailures() int {
	if p.MaxFailures > 0 {
		return p.MaxFailures
	}
	return DefaultMaxFailures
}

func (p SettlePolicy) minBackoff() time.Duration {
	if p.MinBackoff > 0 {
		return p.MinBackoff
	}
	return DefaultMinBackoff
}

func (p SettlePolicy) maxBackoff() time.Duration {
	if p.MaxBackoff > 0 {
		return max(p.MaxBackoff, p.minBackoff())
	}
	return max(DefaultMaxBackoff, p.minBackoff())
}

func invalid(err error) bool {
	return errors.Is(err, ErrInvalidMessage) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrInvalidScope) || errors.Is(err, ErrMissingKeyField)
}

// ExecutionError is returned by Do, Run, DoTx and their database/sql forms
// (DoSQL, DoSQLTx) when the handler ran and returned an error, so its
// execution ended without a stored result. It wraps the handler's error
// (errors.Is and errors.As see it), and its message is that error's.
//
// Other ways an execution ends without a stored result are not
// ExecutionErrors: a Result whose status is not stored is an answer (a nil
// error; the key is failed and the failure counted); a final commit that
// failed is ErrUnavailable, a lost lease ErrLeaseLost, a caller that left
// its context's error (none of them counts as a failure); a panic goes on
// up to the caller.
type ExecutionError struct {
	// Err is the handler's error.
	Err error
	// HandedOff is true when the key stays in progress for a resumption
	// (a step may have had an effect and its outcome is unknown): it
	// settles when a resumption or a later call finishes the execution.
	// Otherwise the key is failed and a later call runs the handler again.
	HandedOff bool
	// Failures counts the executions of the key that ended failed, this
	// one included, as the statement that failed the key returned them
	// (Postgres keeps the count with the key, for its lifecycle). It is 0
	// when the key was handed off, and when the count is not known: the
	// fail was left to the background because Postgres did not answer,
	// the key was no longer this execution's, or DoTx (DoSQLTx), which
	// records no failure. Settle never dead-letters on 0.
	Failures int
}

// Error returns the handler's error's message.
func (e *ExecutionError) Error() string { return e.Err.Error() }

// Unwrap returns the handler's error.
func (e *ExecutionError) Unwrap() error { return e.Err }
