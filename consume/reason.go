package consume

import (
	"errors"

	"github.com/onceonly/onceonly"
)

// The reason label of the broker packages' settled-message counters,
// besides the dead-letter reasons of onceonly (reused, invalid, failed).
const (
	ReasonExecuted  = "executed"   // ack: this execution committed
	ReasonReplayed  = "replayed"   // ack: an earlier copy's did
	ReasonInFlight  = "in_flight"  // retry: another copy holds the key
	ReasonFailed    = "failed"     // retry: the execution failed
	ReasonHandedOff = "handed_off" // retry: handed off to a resumption
	ReasonError     = "error"      // retry: store unavailable, lease lost, canceled
)

// Reason names why a message was settled as s says: ReasonExecuted or
// ReasonReplayed (Ack), s.Reason (DeadLetter), or RetryReason (Retry).
func Reason(s onceonly.Settlement) string {
	switch s.Disposition {
	case onceonly.Ack:
		if s.Outcome.Replayed {
			return ReasonReplayed
		}
		return ReasonExecuted
	case onceonly.DeadLetter:
		return s.Reason
	case onceonly.Retry:
	}
	return RetryReason(s.Err)
}

// RetryReason names why a message comes again, from the error of its
// settlement.
func RetryReason(err error) string {
	if _, ok := onceonly.IsInFlight(err); ok {
		return ReasonInFlight
	}
	if failed, ok := errors.AsType[*onceonly.ExecutionError](err); ok {
		if failed.HandedOff {
			return ReasonHandedOff
		}
		return ReasonFailed
	}
	return ReasonError
}
