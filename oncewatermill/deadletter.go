package oncewatermill

import (
	"errors"
	"fmt"
)

// ReasonMetadata is the metadata field a dead-lettered message carries its
// reason in (onceonly.ReasonReused, ReasonInvalid or ReasonFailed), set
// before the poison queue publishes it; the poison queue adds its own
// reason_poisoned, the error's text.
const ReasonMetadata = "onceonly_reason"

// ErrDeadLetter is what every DeadLetterError is (errors.Is): give
// IsDeadLetter to middleware.PoisonQueueWithFilter.
var ErrDeadLetter = errors.New("oncewatermill: dead letter")

// DeadLetterError is the error the middleware returns for a message that
// can never succeed as it is, for the poison queue in front of it to
// publish. It is the only error the middleware returns.
type DeadLetterError struct {
	// Reason is onceonly.ReasonReused, ReasonInvalid or ReasonFailed.
	Reason string
	// Err is what led to it: onceonly.ErrKeyReused, an invalid key or
	// message, the handler's last error.
	Err error
}

// Error returns the reason and the error that led to it.
func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("oncewatermill: dead letter (%s): %v", e.Reason, e.Err)
}

// Unwrap returns the error that led to the dead letter.
func (e *DeadLetterError) Unwrap() error { return e.Err }

// Is reports whether target is ErrDeadLetter.
func (e *DeadLetterError) Is(target error) bool { return target == ErrDeadLetter }

// IsDeadLetter reports whether err is a DeadLetterError: the filter of
// middleware.PoisonQueueWithFilter.
func IsDeadLetter(err error) bool { return errors.Is(err, ErrDeadLetter) }
