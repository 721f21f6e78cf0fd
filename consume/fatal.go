package consume

import (
	"context"
	"errors"

	"github.com/onceonly/onceonly"
)

// ReasonStopped is the reason label of a message a consumer left to the
// broker as it stopped on a Fatal error.
const ReasonStopped = "stopped"

// Fatal returns the error of a settlement no message can get past: the
// engine's schema is missing or behind (onceonly.ErrSchemaBehind), or the
// engine was not made by onceonly.New (onceonly.ErrNotMade). Every message
// would meet it again, and none is to blame: a consumer stops with it,
// leaving the message to the broker, instead of redelivering messages
// forever or dead-lettering them. nil for any other settlement.
func Fatal(s onceonly.Settlement) error {
	if s.Err != nil && (errors.Is(s.Err, onceonly.ErrSchemaBehind) || errors.Is(s.Err, onceonly.ErrNotMade)) {
		return s.Err
	}
	return nil
}

// Cause returns the Fatal error a consumer's loop was stopped with (the
// cause of its context), or nil.
func Cause(ctx context.Context) error {
	cause := context.Cause(ctx)
	if cause != nil && (errors.Is(cause, onceonly.ErrSchemaBehind) || errors.Is(cause, onceonly.ErrNotMade)) {
		return cause //nolint:wrapcheck // the error a worker of the consumer stopped it with, as it was
	}
	return nil
}
