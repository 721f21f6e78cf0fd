// Package relaywake wakes the relays after commits whose write-through to
// Redis failed, one NOTIFY for all the failures of a moment.
package relaywake

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Waker sends the relays' NOTIFY after commits whose write-through
// failed, coalesced: kicks that arrive while one NOTIFY is on its way are
// answered by the next one, so an outage of Redis costs one NOTIFY per
// round trip, not one per request.
type Waker struct {
	notify  func(ctx context.Context) error
	log     *slog.Logger
	pending chan struct{} // one slot: a wake-up owed
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once
}

// New returns a running Waker that calls notify, logging its failures to log.
func New(notify func(ctx context.Context) error, log *slog.Logger) *Waker {
	w := &Waker{notify: notify, log: log, pending: make(chan struct{}, 1), stop: make(chan struct{})}
	w.done.Go(w.loop)
	return w
}

// Kick asks for a NOTIFY soon; it never blocks.
func (w *Waker) Kick() {
	select {
	case w.pending <- struct{}{}:
	default: // one is owed already: it will cover this commit too
	}
}

func (w *Waker) loop() {
	for {
		select {
		case <-w.stop:
			return
		case <-w.pending:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := w.notify(ctx); err != nil {
			w.log.Warn("notify relays", "err", err)
		}
		cancel()
	}
}

// Close stops the waker; a wake-up still owed is dropped (the relays poll).
func (w *Waker) Close() {
	w.once.Do(func() { close(w.stop) })
	w.done.Wait()
}
