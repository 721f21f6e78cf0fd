package onceonly

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// Defaults of Config.
const (
	DefaultLeaseTimeout = 30 * time.Second
	DefaultCompletedTTL = outbox.DefaultCompletedTTL
	DefaultFailedTTL    = outbox.DefaultFailedTTL
	DefaultRedisTimeout = 100 * time.Millisecond
)

// Config configures an Engine. Only Pool is required.
type Config struct {
	// Pool is the Postgres pool holding the migrated schema.
	Pool *pgxpool.Pool
	// Redis is the cache; nil runs from Postgres alone.
	Redis redis.UniversalClient
	// RedisPrefix prefixes every Redis key (default "idem:").
	RedisPrefix string
	// RedisTimeout bounds every Redis call on the request path; past it the
	// engine carries on from Postgres (default 100ms).
	RedisTimeout time.Duration
	// LeaseTimeout is how long a claim holds a key without a heartbeat
	// (default 30s). The engine renews it every third of that while the
	// handler runs.
	LeaseTimeout time.Duration
	// CompletedTTL and FailedTTL are how long keys are kept (24h, 5m).
	CompletedTTL, FailedTTL time.Duration
	// MaxCachedBody is the largest response body kept in Redis (8 KiB);
	// larger ones are replayed from Postgres.
	MaxCachedBody int
	// ShouldStore tells which handler statuses are stored and replayed. By
	// default: every status below 500 except 408, 409, 425 and 429. Others
	// mark the key failed, so a retry runs the handler again.
	ShouldStore func(status int) bool
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
	// DeferRelayNotify takes the relay's NOTIFY out of the engine's
	// transactions (see outbox.Config.DeferNotify): commits stop queueing
	// on the database-wide NOTIFY lock. The engine then notifies after a
	// commit only when its write-through to Redis failed; events already in
	// Redis reach the relay on its poll (RELAY_POLL_INTERVAL), which only
	// cleans them up.
	DeferRelayNotify bool
	// Registerer receives the engine's Prometheus metrics; nil keeps them
	// unregistered.
	Registerer prometheus.Registerer
}

// Result is what a handler produced: the response that is stored and
// replayed. Status 0 means 200.
type Result = keystate.Response

// Outcome is the answer for one request.
type Outcome struct {
	Result
	// Replayed is true when Result is the stored answer of an earlier
	// execution and the handler did not run.
	Replayed bool
}

// Handler runs the business logic of a first execution. Its writes go
// through tx, which commits together with the key's completion, or not at
// all. Returning an error, a Result with a status that is not stored, or
// panicking marks the key failed.
type Handler func(ctx context.Context, tx pgx.Tx) (Result, error)

// Engine makes handlers run once per (scope, key). It is safe for concurrent
// use; several engines (processes) may share one Postgres and Redis.
type Engine struct {
	cfg     Config
	store   *outbox.Store
	cache   *cache.Cache // nil without Redis
	log     *slog.Logger
	metrics *metrics
}

// New returns an Engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Pool == nil {
		return nil, errors.New("onceonly: Config.Pool is required")
	}
	defaults.Positive(&cfg.LeaseTimeout, DefaultLeaseTimeout)
	defaults.Positive(&cfg.CompletedTTL, DefaultCompletedTTL)
	defaults.Positive(&cfg.FailedTTL, DefaultFailedTTL)
	defaults.Positive(&cfg.RedisTimeout, DefaultRedisTimeout)
	defaults.Positive(&cfg.MaxCachedBody, cache.DefaultMaxBody)
	if cfg.ShouldStore == nil {
		cfg.ShouldStore = DefaultShouldStore
	}
	defaults.Logger(&cfg.Logger)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("onceonly: register metrics: %w", err)
	}
	e := &Engine{
		cfg: cfg,
		store: outbox.New(outbox.Config{
			CompletedTTL: cfg.CompletedTTL, FailedTTL: cfg.FailedTTL, DeferNotify: cfg.DeferRelayNotify,
		}),
		log:     cfg.Logger,
		metrics: m,
	}
	if cfg.Redis != nil {
		e.cache = cache.New(cfg.Redis, cache.Options{Prefix: cfg.RedisPrefix, MaxBody: cfg.MaxCachedBody})
	}
	return e, nil
}

// DefaultShouldStore stores every status below 500 except 408, 409, 425 and
// 429, which say "try again" rather than give an answer.
func DefaultShouldStore(status int) bool {
	switch status {
	case 408, 409, 425, 429:
		return false
	}
	return status < 500
}

// Do runs fn once for (scope, key): the first call runs it, later calls get
// its stored Result with Replayed set. payload identifies the request (a
// message body); the same key with another payload returns ErrKeyReused.
// Other errors: *InFlightError, ErrUnavailable, ErrLeaseLost, ErrInvalidKey,
// ErrInvalidScope, and fn's own error (the key is then failed and retryable).
func (e *Engine) Do(ctx context.Context, scope, key string, payload []byte, fn Handler) (Outcome, error) {
	return e.execute(ctx, scope, key, PayloadFingerprint(payload), fn)
}

func (e *Engine) execute(ctx context.Context, scope, key, fingerprint string, fn Handler) (out Outcome, err error) {
	start := time.Now()
	outcome := outcomeExecuted
	defer func() {
		e.metrics.requests.WithLabelValues(outcome).Inc()
		e.metrics.duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	}()
	if err := ValidateKey(key); err != nil {
		outcome = outcomeInvalid
		return Outcome{}, err
	}
	if err := validateScope(scope); err != nil {
		outcome = outcomeInvalid
		return Outcome{}, err
	}
	ref := keystate.Ref{Scope: scope, Key: key}
	owner := keystate.NewOwner()

	out, outcome, done, err := e.checkCache(ctx, ref, fingerprint, owner)
	if done {
		return out, err
	}

	claim, err := e.store.Claim(ctx, e.cfg.Pool, ref, fingerprint, owner, e.cfg.LeaseTimeout)
	if err != nil {
		e.releaseCache(ref, owner)
		outcome = outcomeUnavailable
		if ctx.Err() != nil {
			return Outcome{}, ctx.Err()
		}
		return Outcome{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !claim.Claimed {
		e.applyCache(claim.Key) // read-repair: the cache learns what Postgres holds
		out, outcome, err = e.answerHeld(claim.Key, fingerprint)
		return out, err
	}

	out, outcome, err = e.run(ctx, ref, owner, fn)
	return out, err
}

// checkCache asks Redis first. done is true when Redis answered the request.
func (e *Engine) checkCache(ctx context.Context, ref keystate.Ref, fingerprint string, owner keystate.Owner) (Outcome, string, bool, error) {
	if e.cache == nil {
		return Outcome{}, "", false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
	res, err := e.cache.Check(rctx, ref, fingerprint, owner, e.cfg.LeaseTimeout)
	cancel()
	if err != nil {
		e.redisFailed(redisOpCheck, err)
		return Outcome{}, "", false, nil
	}
	switch res.Verdict {
	case cache.Replay:
		if res.Entry.BodyInPostgres {
			return Outcome{}, "", false, nil // Postgres answers with the body
		}
		return Outcome{Result: res.Entry.Response, Replayed: true}, outcomeReplayedCache, true, nil
	case cache.InFlight:
		return Outcome{}, outcomeInFlight, true, &InFlightError{RetryAfter: res.RetryAfter}
	case cache.Mismatch:
		return Outcome{}, outcomeReused, true, ErrKeyReused
	}
	return Outcome{}, "", false, nil
}

// answerHeld answers from the Postgres row of a key this request could not
// claim.
func (e *Engine) answerHeld(k keystate.Key, fingerprint string) (Outcome, string, error) {
	if k.Fingerprint != fingerprint {
		return Outcome{}, outcomeReused, ErrKeyReused
	}
	switch k.Status {
	case keystate.Completed:
		return Outcome{Result: k.Response, Replayed: true}, outcomeReplayedDB, nil
	case keystate.InProgress:
		return Outcome{}, outcomeInFlight, &InFlightError{RetryAfter: max(k.LeaseRemaining, time.Second)}
	case keystate.Failed:
	}
	// failed between our claim and our read: the next try claims it.
	return Outcome{}, outcomeInFlight, &InFlightError{RetryAfter: time.Second}
}

// run executes fn under owner's lease and records the result.
func (e *Engine) run(ctx context.Context, ref keystate.Ref, owner keystate.Owner, fn Handler) (Outcome, string, error) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopHeartbeat := e.heartbeat(hctx, cancel, ref, owner)
	defer stopHeartbeat()

	var (
		res       Result
		handled   bool
		handleErr error
		stored    keystate.Key
	)
	txErr := pgx.BeginFunc(hctx, e.cfg.Pool, func(tx pgx.Tx) error {
		defer func() {
			if p := recover(); p != nil {
				// Roll back and fail the key before the panic goes on.
				_ = tx.Rollback(context.WithoutCancel(hctx))
				e.fail(ref, owner)
				panic(p)
			}
		}()
		res, handleErr = fn(hctx, tx)
		handled = true
		if res.Status == 0 {
			res.Status = 200
		}
		if handleErr != nil || !e.cfg.ShouldStore(res.Status) {
			return errRollback
		}
		var err error
		stored, err = e.store.Complete(hctx, tx, ref, owner, res)
		return err
	})
	switch {
	case txErr == nil:
		e.writeThrough(stored)
		return Outcome{Result: res}, outcomeExecuted, nil
	case errors.Is(txErr, outbox.ErrLeaseLost) || errors.Is(context.Cause(hctx), outbox.ErrLeaseLost):
		return Outcome{}, outcomeLeaseLost, ErrLeaseLost
	}
	e.fail(ref, owner)
	switch {
	case handleErr != nil:
		return Outcome{}, outcomeHandlerError, handleErr
	case handled && errors.Is(txErr, errRollback):
		return Outcome{Result: res}, outcomeFailed, nil
	case ctx.Err() != nil:
		return Outcome{}, outcomeFailed, ctx.Err()
	}
	// The commit (or begin) failed; whether a commit that lost its
	// connection went through is unknown, so the key is left to the lease
	// if fail could not run either, and the client retries.
	return Outcome{}, outcomeUnavailable, fmt.Errorf("%w: %w", ErrUnavailable, txErr)
}

var errRollback = errors.New("rollback: result not stored")

// heartbeat renews the lease every third of LeaseTimeout until stopped; if
// the lease is lost it cancels the handler's context with ErrLeaseLost.
func (e *Engine) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, ref keystate.Ref, owner keystate.Owner) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(e.cfg.LeaseTimeout / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				err := e.store.Heartbeat(ctx, e.cfg.Pool, ref, owner, e.cfg.LeaseTimeout)
				if errors.Is(err, outbox.ErrLeaseLost) {
					cancel(outbox.ErrLeaseLost)
					return
				}
				if err != nil && ctx.Err() == nil {
					e.log.Warn("lease heartbeat failed", "scope", ref.Scope, "key", ref.Key, "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// fail marks the key failed, on a context of its own: a request canceled by
// its client must not leave the key claimed.
func (e *Engine) fail(ref keystate.Ref, owner keystate.Owner) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	k, err := e.store.Fail(ctx, e.cfg.Pool, ref, owner)
	if err != nil {
		if !errors.Is(err, outbox.ErrLeaseLost) {
			e.log.Error("mark key failed; it stays claimed until its lease ends", "scope", ref.Scope, "key", ref.Key, "err", err)
		}
		return
	}
	e.writeThrough(k)
}

// writeThrough copies a transition this engine committed into Redis. With
// DeferRelayNotify, a copy that did not land wakes the relay instead.
func (e *Engine) writeThrough(k keystate.Key) {
	if e.applyCache(k) || !e.cfg.DeferRelayNotify {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.store.Notify(ctx, e.cfg.Pool); err != nil {
		e.log.Warn("notify relays", "err", err)
	}
}

// applyCache writes a Postgres state through to Redis, best effort: the
// relay delivers it anyway. It reports whether Redis took the write (or
// already held it).
func (e *Engine) applyCache(k keystate.Key) bool {
	if e.cache == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RedisTimeout)
	defer cancel()
	if _, err := e.cache.Apply(ctx, k); err != nil {
		e.redisFailed(redisOpApply, err)
		return false
	}
	return true
}

// releaseCache drops this request's provisional claim, best effort.
func (e *Engine) releaseCache(ref keystate.Ref, owner keystate.Owner) {
	if e.cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RedisTimeout)
	defer cancel()
	if _, err := e.cache.Release(ctx, ref, owner); err != nil {
		e.redisFailed(redisOpRelease, err)
	}
}

func (e *Engine) redisFailed(op string, err error) {
	e.metrics.redisFallback.WithLabelValues(op).Inc()
	e.log.Debug("redis unavailable, carrying on from Postgres", "op", op, "err", err)
}
