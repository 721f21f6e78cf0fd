// Package backoff computes retry delays: exponential growth with full
// jitter, so a crowd of retrying processes spreads out instead of returning
// in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff hands out growing delays between Min and Max. The zero value is
// not usable; set both bounds. It is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	attempt  int
}

// Next returns the delay before the next attempt: a random duration in
// [Min, min(Max, Min·2^n)] after n failures in a row.
func (b *Backoff) Next() time.Duration {
	ceiling := b.Min << min(b.attempt, 30)
	if ceiling <= 0 || ceiling > b.Max {
		ceiling = b.Max
	}
	b.attempt++
	if ceiling <= b.Min {
		return b.Min
	}
	return b.Min + rand.N(ceiling-b.Min+1)
}

// Reset starts over after a success.
func (b *Backoff) Reset() { b.attempt = 0 }

// Sleep waits d or until ctx ends, and returns ctx's error in that case. A
// d of zero or less returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
