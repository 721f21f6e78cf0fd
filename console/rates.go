package console

import (
	"maps"
	"sync"
	"time"
)

// rateWindow is how many minutes of request counts the console keeps.
const rateWindow = 30

// rates keeps the requests the engine answered in each of the last minutes,
// by outcome. It samples the engine's cumulative counters (its
// onceonly_requests_total, Engine.RequestCounts) and adds each sample's
// increase to the minute the sample was taken in: a minute holds what
// happened between the sample before it and its last sample, so counts
// land at most a sample interval late. Requests answered before the first
// sample are not counted in any minute. The counts are this process's
// engine's: with several processes, each console shows its own.
type rates struct {
	counts func() map[string]float64

	mu sync.Mutex
	// last is the previous sample; nil before the first.
	last map[string]float64
	// ring holds a minute per slot, indexed by its Unix minute modulo its
	// length; a slot whose start is not the minute asked for is stale.
	ring []minute
}

// minute is the requests of one minute by outcome.
type minute struct {
	start  time.Time
	counts map[string]float64
}

func newRates(counts func() map[string]float64, window int) *rates {
	return &rates{counts: counts, ring: make([]minute, window)}
}

// sample reads the counters at now and adds their increase since the last
// sample to now's minute.
func (r *rates) sample(now time.Time) {
	cur := r.counts()
	r.mu.Lock()
	defer r.mu.Unlock()
	last := r.last
	r.last = cur
	if last == nil {
		return // the baseline
	}
	m := r.slot(now)
	for outcome, n := range cur {
		if d := n - last[outcome]; d > 0 {
			m.counts[outcome] += d
		}
	}
}

// slot returns the ring's slot for now's minute, emptied if it held an
// older one. Call with mu held.
func (r *rates) slot(now time.Time) *minute {
	start := now.Truncate(time.Minute)
	m := &r.ring[int(start.Unix()/60)%len(r.ring)]
	if !m.start.Equal(start) {
		*m = minute{start: start, counts: map[string]float64{}}
	}
	return m
}

// window returns the last n minutes up to now's, oldest first; a minute
// nothing was sampled in has no counts.
func (r *rates) window(now time.Time, n int) []minute {
	n = min(n, len(r.ring))
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]minute, n)
	end := now.Truncate(time.Minute)
	for i := range n {
		start := end.Add(-time.Duration(n-1-i) * time.Minute)
		out[i] = minute{start: start, counts: map[string]float64{}}
		if m := r.ring[int(start.Unix()/60)%len(r.ring)]; m.start.Equal(start) {
			out[i].counts = maps.Clone(m.counts)
		}
	}
	return out
}

// sampled reports whether a sample has been taken.
func (r *rates) sampled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last != nil
}
