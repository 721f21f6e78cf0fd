// Package relaywake wakes the relays after commits whose write-through to
// Redis failed, one NOTIFY for all the failures of a moment.
package relaywake

import (
	"context"
	"log/slog"
	"time"

	"github.com/onceonly/onceonly/startstop"
)

// notifyTimeout bounds one NOTIFY.
const notifyTimeout = 5 * time.Second

// Waker sends the relays' NOTIFY after commits whose write-through
// failed, coalesced: kicks that arrive while one NOTIFY is on its way are
// answered by the next one, so an outage of Redis costs one NOTIFY per
// round trip, not one per request. Kicks before Start or after Stop are
// kept (one) until the next Start.
type Waker struct {
	base    startstop.Base
	notify  func(ctx context.Context) error
	log     *slog.Logger
	pending chan struct{} // one slot: a wake-up owed
}

var _ startstop.Service = (*Waker)(nil)

// New returns a Waker that calls notify, logging its failures to log.
func New(notify func(ctx context.Context) error, log *slog.Logger) *Waker {
	return &Waker{notify: notify, log: log, pending: make(chan struct{}, 1)}
}

// Start starts sending the NOTIFYs owed until ctx ends or Stop.
func (w *Waker) Start(ctx context.Context) error {
	ctx, ok, started, stopped := w.base.StartInit(ctx)
	if !ok {
		return nil
	}
	go func() {
		defer stopped()
		started()
		w.loop(ctx)
	}()
	return nil
}

// Stop stops the waker; a wake-up still owed is dropped (the relays poll).
func (w *Waker) Stop() { w.base.Stop() }

// Started is closed once the waker runs.
func (w *Waker) Started() <-chan struct{} { return w.base.Started() }

// Stopped is closed once the waker has stopped.
func (w *Waker) Stopped() <-chan struct{} { return w.base.Stopped() }

// Kick asks for a NOTIFY soon; it never blocks.
func (w *Waker) Kick() {
	select {
	case w.pending <- struct{}{}:
	default: // one is owed already: it will cover this commit too
	}
}

func (w *Waker) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.pending:
		}
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), notifyTimeout)
		if err := w.notify(nctx); err != nil {
			w.log.Warn("notify relays", "err", err)
		}
		cancel()
	}
}
