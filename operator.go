package onceonly

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/onceonly/onceonly/keystate"
)

// The operators' methods: what a console (or a command) needs beyond
// Inspect and Purge to act on keys and outbox events. Each keeps the
// invariants as the engine's own transitions do: writes go through the
// outbox or a compare-and-set, never around them.

// Delete purges (scope, key) as Purge does, then deletes its row at once
// instead of leaving it to the reconciler's retention: it raises the version
// floor to the purged version first, so the key, created again, starts above
// every version it had (and no old copy outranks it). The Redis copy is
// deleted by the purge. A key claimed again between the two steps is live
// and stays (its new life began after the purge). Errors as Purge's.
func (e *Engine) Delete(ctx context.Context, scope, key string, force bool) error {
	if err := e.Purge(ctx, scope, key, force); err != nil {
		return err
	}
	if _, err := e.store.DeletePurged(ctx, e.cfg.Pool, keystate.Ref{Scope: scope, Key: key}); err != nil {
		return fmt.Errorf("delete key: %w", fromStore(err))
	}
	return nil
}

// RepairCache writes the Postgres state of (scope, key) into Redis now, as
// a reconcile pass would repair it: the row when it is live, no value when
// it is not. The write is a compare-and-set against the value read just
// before it, so a newer write (a request's, the relay's) is never undone,
// and a provisional claim under a live lease (a request in flight) is left
// alone. It reports whether Redis changed; a key in step changes nothing.
// An engine without Redis returns ErrNoRedis.
func (e *Engine) RepairCache(ctx context.Context, scope, key string) (bool, error) {
	if err := e.made(); err != nil {
		return false, err
	}
	if e.cache == nil {
		return false, ErrNoRedis
	}
	ref := keystate.Ref{Scope: scope, Key: key}
	name := e.cache.Key(ref)
	headers, err := e.cache.ReadHeaders(ctx, []string{name})
	if err != nil {
		return false, fmt.Errorf("repair cache: %w", err)
	}
	seen := headers[0]
	if seen.Unavailable {
		return false, fmt.Errorf("repair cache: Redis cannot serve %s", name)
	}
	current, err := e.store.CurrentKeys(ctx, e.cfg.Pool, []keystate.Ref{ref}, e.cfg.MaxCachedBody)
	if err != nil {
		return false, fmt.Errorf("repair cache: %w", fromStore(err))
	}
	k, live := current[ref]
	live = live && k.ExpiresIn > 0
	switch {
	case !live && !seen.Found:
		return false, nil // nothing on either side
	case !live:
		k = keystate.Gone(ref, 0)
	case seen.Found && !seen.Corrupt && !seen.Provisional && seen.State == k.Status && seen.Version == k.Version:
		return false, nil // in step
	}
	results, err := e.cache.RepairBatch(ctx, []keystate.Key{k}, []string{seen.Expect()})
	if err != nil {
		return false, fmt.Errorf("repair cache: %w", err)
	}
	if results[0].Err != nil {
		return false, fmt.Errorf("repair cache: %w", results[0].Err)
	}
	return results[0].Applied, nil
}

// Unpark puts parked outbox events (outbox.id; the relay parks an event
// Redis refused RELAY_MAX_ATTEMPTS times) back in the relays' queue, their
// attempts counted from zero again, and wakes the relays. It returns how
// many it unparked; ids that name no parked event are left alone.
func (e *Engine) Unpark(ctx context.Context, ids []int64) (int, error) {
	if err := e.made(); err != nil {
		return 0, err
	}
	n, err := e.store.Unpark(ctx, e.cfg.Pool, ids)
	if err != nil {
		return 0, fmt.Errorf("unpark: %w", fromStore(err))
	}
	return n, nil
}

// RequestCounts returns how many requests this engine has answered since
// it was made, by outcome: the values of its counter
// onceonly_requests_total (executed, replayed_cache, replayed_db,
// in_flight, reused, failed, …), whether or not Config.Registerer exports
// them. A console samples it to chart the requests of the last minutes.
func (e *Engine) RequestCounts() map[string]float64 {
	if e.made() != nil {
		return nil
	}
	ch := make(chan prometheus.Metric, 16)
	go func() {
		e.metrics.requests.Collect(ch)
		close(ch)
	}()
	counts := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil || d.GetCounter() == nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == labelOutcome {
				counts[l.GetValue()] = d.GetCounter().GetValue()
			}
		}
	}
	return counts
}
