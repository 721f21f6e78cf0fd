package onceonly

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/cache"
	"github.com/onceonly/onceonly/internal/keystate"
)

// DoTx is Do inside a transaction the caller owns: the claim, fn's writes
// and the key's completion all happen in tx (under a savepoint), and the
// caller commits — so a consumer that already holds a transaction (a
// watermill-sql handler's, River's JobCompleteTx pattern, a unit of work)
// makes the key part of it. The first call runs fn; later calls get its
// stored Result with Replayed set, from Redis when the relay delivered it,
// else from Postgres. payload is fingerprinted as in Do.
//
// What holds as with Do: fn's writes and the key's completion commit
// together or not at all (I1); a stored answer is replayed identically
// (I2); the same key with another payload returns ErrKeyReused. An error of
// fn, a panic, or a Result with a status that is not stored rolls back to
// the savepoint: fn's writes and the claim are undone, the key stays as it
// was (absent or failed, so retryable: I3), and tx remains usable — the
// caller may still commit its other work.
//
// What changes: the key is held by the uncommitted row, not by a lease.
// Nobody sees the claim before the caller commits; a concurrent request for
// the same key waits in Postgres for that commit (then replays) or rollback
// (then claims), instead of a 409 — keep tx short. Nothing renews or
// fences a lease and no step can run (Step returns ErrNoExecution): a
// handler that calls systems outside Postgres needs Run. A dead caller's
// key is released by Postgres rolling back its transaction when the
// connection ends, not by the reaper. The engine cannot write the result
// through to Redis before the commit, so replays come from Postgres until
// the relay delivers the key's event: on its poll, or at the commit with
// Config.NotifyInTransaction and a listening relay.
func (e *Engine) DoTx(ctx context.Context, tx pgx.Tx, scope, key string, payload []byte, fn Handler) (out Outcome, err error) {
	fp := payloadFingerprint(payload)
	ctx, call, err := e.enter(ctx, scope, key, "", true)
	outcome := outcomeExecuted
	defer func() { e.leave(call, outcome, out.Replayed, err) }()
	if err != nil {
		outcome = outcomeInvalid
		return Outcome{}, err
	}
	ref := keystate.Ref{Scope: scope, Key: key}
	if cached, done, err := e.readCache(ctx, ref, fp); done {
		outcome = outcomeReplayedCache
		if err != nil {
			outcome = outcomeReused
		}
		return cached, err
	}
	sp, err := tx.Begin(ctx) // a savepoint: unless released below, the claim and fn's writes are undone
	if err != nil {
		outcome = outcomeUnavailable
		return Outcome{}, fmt.Errorf("%w: savepoint: %w", ErrUnavailable, err)
	}
	defer func() { _ = sp.Rollback(context.WithoutCancel(ctx)) }() // a no-op once released
	claim, err := e.store.Claim(ctx, sp, ref, fp, e.owners.Next(), e.cfg.LeaseTimeout)
	if err != nil {
		outcome = outcomeUnavailable
		return Outcome{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !claim.Claimed {
		out, outcome, err = e.answerHeld(claim.Key, fp)
		return out, err
	}
	hctx, hspan := e.startSpan(ctx, spanHandler)
	res, err := fn(hctx, sp)
	endSpan(hspan, err)
	if err != nil {
		outcome = outcomeHandlerError
		return Outcome{}, err
	}
	if res.Status == 0 {
		res.Status = http.StatusOK
	}
	if !e.cfg.ShouldStore(res.Status) {
		outcome = outcomeFailed
		return Outcome{Result: res}, nil
	}
	if _, err := e.store.Complete(ctx, sp, ref, claim.Key.Owner, res); err != nil {
		outcome = outcomeUnavailable
		return Outcome{}, fmt.Errorf("%w: complete: %w", ErrUnavailable, err)
	}
	if err := sp.Commit(ctx); err != nil {
		outcome = outcomeUnavailable
		return Outcome{}, fmt.Errorf("%w: release savepoint: %w", ErrUnavailable, err)
	}
	return Outcome{Result: res}, nil
}

// readCache answers a replay or a reuse from Redis without claiming
// anything there; done is false when Postgres must answer.
func (e *Engine) readCache(ctx context.Context, ref keystate.Ref, fp string) (Outcome, bool, error) {
	if e.cache == nil {
		return Outcome{}, false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
	entry, found, err := e.cache.Read(rctx, ref)
	cancel()
	if err != nil {
		if !errors.Is(err, cache.ErrCorrupt) {
			e.redisFailed(redisOpCheck, err)
		}
		return Outcome{}, false, nil // Redis is a cache: Postgres answers when it cannot
	}
	switch {
	case !found || entry.Provisional:
	case entry.Digest != cache.Digest(fp):
		if entry.State != keystate.InProgress { // a claim in progress may be gone: Postgres judges
			return Outcome{}, true, ErrKeyReused
		}
	case entry.State == keystate.Completed && !entry.BodyInPostgres:
		return Outcome{Result: entry.Response, Replayed: true}, true, nil
	}
	return Outcome{}, false, nil
}
