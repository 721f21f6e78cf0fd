package onceamqp

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// holds keeps the deliveries waiting for their redelivery: each is
// requeued by a timer after its settlement's After. A stop drops the
// timers: the broker requeues those deliveries when their channel closes.
type holds struct {
	gauge prometheus.Gauge

	mu      sync.Mutex
	timers  map[*hold]struct{}
	stopped bool
}

type hold struct{ timer *time.Timer }

func newHolds(gauge prometheus.Gauge) *holds {
	return &holds{gauge: gauge, timers: make(map[*hold]struct{})}
}

// start lets add hold deliveries (again, after a stop).
func (h *holds) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = false
}

// add calls release after d, unless stop comes first. After a stop it
// does nothing.
func (h *holds) add(d time.Duration, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	e := &hold{}
	// The timer's function takes the lock first, so it finds e registered.
	e.timer = time.AfterFunc(d, func() {
		h.mu.Lock()
		_, ok := h.timers[e]
		delete(h.timers, e)
		h.gauge.Set(float64(len(h.timers)))
		h.mu.Unlock()
		if ok {
			release()
		}
	})
	h.timers[e] = struct{}{}
	h.gauge.Set(float64(len(h.timers)))
}

// stop drops every hold and refuses new ones until the next start.
func (h *holds) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	for e := range h.timers {
		e.timer.Stop()
	}
	clear(h.timers)
	h.gauge.Set(0)
}
