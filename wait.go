package onceonly

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/keystate"
)

// Pauses of await between two asks.
const (
	// awaitWatched is the pause while Redis would announce the key
	// settling: a safety net for an announcement that never comes (the
	// holder died; the key settles when its lease ends or a resumption
	// finishes it).
	awaitWatched = time.Second
	// awaitPollFirst and awaitPollMax bound the backoff without Redis,
	// when every ask is answered by Postgres.
	awaitPollFirst = 10 * time.Millisecond
	awaitPollMax   = 250 * time.Millisecond
)

// await waits up to bound for the execution that holds ref to settle,
// asking again with ask each time it may have: when Redis announces it,
// when the holder's lease is due to end, every awaitWatched while watching,
// or on a backoff when Redis is unavailable. It returns the first answer
// that is not *InFlightError, or the last one past bound. ask runs with the
// caller's context, so the request may become the execution itself when
// the holder's lease ends.
func (e *Engine) await(ctx context.Context, ref keystate.Ref, bound time.Duration, ask func(ctx context.Context) (Outcome, error)) (Outcome, error) {
	deadline := time.Now().Add(bound)
	var settled <-chan *redis.Message
	if e.cache != nil {
		wctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
		ps, err := e.cache.Watch(wctx, ref)
		cancel()
		if err != nil {
			e.redisFailed(redisOpWatch, err)
		} else {
			defer func() { _ = ps.Close() }()
			settled = ps.Channel()
		}
	}
	e.metrics.waits.Inc()
	poll := awaitPollFirst
	for {
		out, err := ask(ctx) // the first ask covers a settlement before the watch began
		inFlight, ok := IsInFlight(err)
		remaining := time.Until(deadline)
		if !ok || remaining <= 0 {
			return out, err
		}
		pause := awaitWatched
		if settled == nil {
			pause, poll = poll, min(2*poll, awaitPollMax)
		}
		timer := time.NewTimer(min(pause, remaining, max(inFlight.LeaseRemaining, time.Millisecond)))
		select {
		case <-ctx.Done():
			timer.Stop()
			return Outcome{}, ctx.Err()
		case _, open := <-settled:
			if !open {
				settled = nil
			}
		case <-timer.C:
		}
		timer.Stop()
	}
}
