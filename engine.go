package onceonly

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/onceonly/backoff"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/claimbatch"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/internal/exectx"
	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/internal/relaywake"
	"github.com/onceonly/onceonly/internal/schemaver"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/startstop"
)

// Defaults of Config.
const (
	DefaultLeaseTimeout   = 30 * time.Second
	DefaultCompletedTTL   = outbox.DefaultCompletedTTL
	DefaultFailedTTL      = outbox.DefaultFailedTTL
	DefaultRedisTimeout   = 100 * time.Millisecond
	DefaultResumeInterval = 5 * time.Second
)

// Config configures an Engine. Only Pool is required.
type Config struct {
	// Pool is the Postgres pool holding the migrated schema.
	Pool *pgxpool.Pool
	// DB, when set, is a database/sql handle on the same database as Pool,
	// of any driver over Postgres (pgx's stdlib, lib/pq): an execution's
	// handler may then write through SQLTx, a transaction on DB that
	// commits with the key's completion (DoSQL). The engine's own work
	// (claims, leases, steps) stays on Pool. With DB set, executions run
	// two-phase: TwoPhase is implied.
	DB *sql.DB
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
	// ResumeInterval is how often Resume looks for executions to finish
	// (default 5s; keep it at most the reconciler's interval).
	ResumeInterval time.Duration
	// TwoPhase runs every execution two-phase from the start: its claim
	// commits on its own, before the handler runs, under a lease the engine
	// renews. By default an execution begins as a single commit instead:
	// one round trip begins its transaction, takes the key's
	// transaction-scoped advisory lock (a duplicate in flight is turned
	// away: I4) and finds the key has no row; a handler that only writes to
	// Postgres then completes in one commit, the key's row written once,
	// with its result. Its first Step promotes it: the claim commits (in
	// progress, with its lease and owner, the lock held until then) and it
	// goes on two-phase, steps, fencing, heartbeats and resumption as ever.
	// A key that has a row (failed, taken over) is claimed two-phase.
	//
	// Until its first step (for the whole run if it never steps) such an
	// execution holds a pooled connection and an open transaction, has no
	// heartbeat and Fence().Version 0, and is bounded by LeaseTimeout:
	// Postgres ends a transaction that outlives it (statement_timeout,
	// idle_in_transaction_session_timeout; TCP keepalives, set once per
	// connection, find a dead client host), which fails the handler and
	// leaves the key retryable (I5, I3). Set TwoPhase when handlers may
	// run longer than the lease before they step or write (or raise
	// LeaseTimeout), when the pool cannot spare a connection per running
	// handler, or when running executions must show in Postgres (Inspect,
	// the console) from their start. With DB set, executions run two-phase
	// whatever TwoPhase says.
	TwoPhase bool
	// Deprecated: executions begin as a single commit by default now;
	// SingleCommit has no effect. See TwoPhase.
	SingleCommit bool
	// Daemons configures what Start runs beside the handlers: the relay,
	// the reconciler and the resumer (all three by default).
	Daemons Daemons
	// Tuning holds switches most services never set.
	Tuning Tuning
	// Registerer receives the engine's Prometheus metrics; nil keeps them
	// unregistered.
	Registerer prometheus.Registerer
	// TracerProvider receives the engine's OpenTelemetry spans (see
	// TracerName); nil uses the global provider, which records nothing
	// until an SDK is installed.
	TracerProvider trace.TracerProvider
}

// Tuning holds the engine's switches that most services never set: ways
// to turn off an optimisation (to measure it, or to rule it out) and
// rolling-upgrade switches. The zero value is the default every benchmark
// measured.
type Tuning struct {
	// RedisNoAutoPipeline sends every Redis command of the request path on
	// a round trip of its own. By default, commands that requests send
	// while others are on the wire go together in the next pipeline (a
	// cluster client always sends each on its own).
	RedisNoAutoPipeline bool
	// NoClaimBatching sends every claim in a statement and a commit of its
	// own. By default, claims that executions make while another batch of
	// claims is in flight go together in the next statement (group commit):
	// the claim is a third of a first execution's Postgres work, and most
	// of it is the statement's, not the key's.
	NoClaimBatching bool
	// NotifyInTransaction sends the relays' NOTIFY inside the engine's
	// transactions, so a listening relay hears of every transition at its
	// commit. By default the engine's transactions send none — a NOTIFY
	// takes a database-wide lock at commit, which serialises commits — and
	// the engine wakes the relays after a commit only when its
	// write-through to Redis failed (one NOTIFY for all the failures of a
	// moment); events already in Redis reach the relay on its poll
	// (RELAY_POLL_INTERVAL), which only deletes them. Events of DoTx, whose
	// commit the engine does not see, also wait for that poll unless this
	// is set.
	NotifyInTransaction bool
	// NoSchemaCheck makes New skip its check of the schema (one statement
	// reading onceonly_db_version, the migrations' version table). Set it
	// only when the schema is migrated by a tool that does not record
	// goose's versions there (its SQL copied into another migration tool),
	// or when New must succeed while Postgres is down.
	NoSchemaCheck bool
	// RedisWriteLayout1 writes completed values in the layout releases
	// before 2026-11-24 read: for a rolling upgrade from one, on every
	// process (relay.Config and reconcile.Config have it too), until none
	// of them runs.
	RedisWriteLayout1 bool
}

// Result is what a handler produced: the response that is stored and
// replayed, byte for byte, to every retry of its key. Status 0 means 200.
type Result struct {
	// Status is the HTTP status code (0 means 200).
	Status int
	// ContentType is the Content-Type of Body; empty when none.
	ContentType string
	// Header holds the other headers the handler set; Content-Type,
	// Content-Length, Date and hop-by-hop headers are never stored.
	Header http.Header
	// Body is the response body.
	Body []byte
}

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
	tracer  atomic.Pointer[tracerOf] // of the provider last used
	leases  *lease.Keeper
	owners  *keystate.OwnerSource
	wake    *relaywake.Waker
	claims  *claimbatch.Group // nil with Tuning.NoClaimBatching

	mu    sync.Mutex
	funcs map[string]Func // registered handlers, by name

	// releases are the releases retried in the background (see
	// releaseLater); Close ends them by closing closing, and no new one
	// starts once closed is set (under releasesMu).
	releases   sync.WaitGroup
	releasesMu sync.Mutex

	// daemons are what Start runs (nil until it first does), under daemonsMu.
	daemonsMu sync.Mutex
	daemons   []startstop.Service
	closed    bool
	closing   chan struct{}

	// daemonsDone is the Done channel of the context Start last ran the
	// daemons on; daemonsClosed is set by Close. Both under daemonsMu.
	daemonsDone   <-chan struct{}
	daemonsClosed bool
}

// schemaCheckTimeout bounds New's check of the schema.
const schemaCheckTimeout = 10 * time.Second

// New returns an Engine. It reads the schema's version once (unless
// Tuning.NoSchemaCheck): on a database whose onceonly schema is missing or
// behind this release it returns an error wrapping ErrSchemaBehind, which
// names the fix (migrations.Up, or `api migrate up`); when Postgres does
// not answer within 10 s, one wrapping ErrUnavailable.
//
//nolint:contextcheck,nolintlint // New starts the engine's own loop (the relay waker), which belongs to no request and which Close stops (contextcheck reads this on the callee; nolintlint cannot see that use).
func New(cfg Config) (*Engine, error) {
	if cfg.Pool == nil {
		return nil, errors.New("onceonly: Config.Pool is required")
	}
	if nilInterface(cfg.Redis) {
		return nil, errNilRedis
	}
	if !cfg.Tuning.NoSchemaCheck {
		if err := checkSchema(cfg.Pool); err != nil {
			return nil, err
		}
	}
	defaults.Positive(&cfg.LeaseTimeout, DefaultLeaseTimeout)
	defaults.Positive(&cfg.CompletedTTL, DefaultCompletedTTL)
	defaults.Positive(&cfg.FailedTTL, DefaultFailedTTL)
	defaults.Positive(&cfg.RedisTimeout, DefaultRedisTimeout)
	defaults.Positive(&cfg.MaxCachedBody, cache.DefaultMaxBody)
	defaults.Positive(&cfg.ResumeInterval, DefaultResumeInterval)
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
			CompletedTTL: cfg.CompletedTTL, FailedTTL: cfg.FailedTTL, DeferNotify: !cfg.Tuning.NotifyInTransaction,
		}),
		log:     cfg.Logger,
		metrics: m,
		owners:  keystate.NewOwnerSource(),
		funcs:   map[string]Func{},
	}
	e.closing = make(chan struct{})
	e.leases = lease.NewKeeper(e.store, cfg.Pool.Config().ConnConfig.Copy(), cfg.LeaseTimeout, e.log.Warn)
	if !cfg.Tuning.NoClaimBatching {
		e.claims = claimbatch.New(e.store, cfg.Pool, cfg.LeaseTimeout, m.claimBatches, m.claimFailures)
	}
	e.wake = relaywake.New(func(ctx context.Context) error { return e.store.Notify(ctx, cfg.Pool) }, e.log)
	if err := e.wake.Start(context.Background()); err != nil { // the engine's own loop: Close stops it
		return nil, fmt.Errorf("onceonly: start the relay waker: %w", err)
	}
	if cfg.Redis != nil {
		e.cache = cache.New(cfg.Redis, cache.Options{
			Prefix: cfg.RedisPrefix, MaxBody: cfg.MaxCachedBody,
			NoAutoPipeline: cfg.Tuning.RedisNoAutoPipeline, WriteLayout1: cfg.Tuning.RedisWriteLayout1,
		})
	}
	return e, nil
}

// checkSchema is New's check of the schema: one statement.
//
//nolint:contextcheck,nolintlint // New takes no context; the check is bounded by schemaCheckTimeout.
func checkSchema(pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaCheckTimeout)
	defer cancel()
	err := schemaver.Check(ctx, pool)
	switch {
	case err == nil, errors.Is(err, ErrSchemaBehind):
		return err //nolint:wrapcheck // it names the fix already
	}
	return unavailable(err)
}

// Close stops what Start started, ends the releases the engine retries in
// the background (a key left claimed then waits for its lease), stops the
// engine's lease renewals and closes their connection. Executions still
// running lose their leases. End Resume (its context) first. Start
// returns ErrClosed once Close has begun.
//
//nolint:contextcheck,nolintlint // callers need not pass a context: Close ends the engine's own goroutine and connection, which belong to no request (contextcheck reads this on the callee; nolintlint cannot see that use).
func (e *Engine) Close() {
	if e.made() != nil {
		return
	}
	e.closeDaemons()
	e.releasesMu.Lock()
	if !e.closed {
		e.closed = true
		close(e.closing)
	}
	e.releasesMu.Unlock()
	e.releases.Wait()
	e.leases.Close(context.Background())
	e.wake.Stop()
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
// fn writes through tx, which commits together with the key's completion.
// Other errors: *InFlightError, ErrUnavailable, ErrLeaseLost, ErrInvalidKey,
// ErrInvalidScope, and an *ExecutionError wrapping fn's own error (the key
// is then failed and retryable; errors.Is and errors.As see fn's error
// through it). A Result whose status is not stored (Config.ShouldStore)
// fails the key too, but is returned as an answer, with a nil error. A
// handler that calls systems outside Postgres is a Func: see Register and
// Run. Settle turns any of these answers into a broker's ack, redelivery
// or dead letter.
func (e *Engine) Do(ctx context.Context, scope, key string, payload []byte, fn Handler) (Outcome, error) {
	if err := e.canDo(fn == nil); err != nil {
		return Outcome{}, err
	}
	return e.execute(ctx, e.modeFor(), scope, key, fingerprint{value: payloadFingerprint(payload)}, "", func() []byte { return payload }, withTx(fn))
}

// withTx runs a Handler as a Func: the transaction opens first.
func withTx(fn Handler) Func {
	return func(ctx context.Context, x *Execution) (Result, error) {
		tx, err := x.Tx(ctx)
		if err != nil {
			return Result{}, err
		}
		return fn(ctx, tx)
	}
}

// execute runs fn once for (scope, key) in mode m: Redis is asked first,
// then Postgres, and the execution that takes the key runs fn (run).
func (e *Engine) execute(ctx context.Context, m mode, scope, key string, fp fingerprint, handler string, request func() []byte, fn Func) (out Outcome, err error) {
	ctx, call, err := e.enter(ctx, scope, key, handler, m.callerCommits())
	outcome := outcomeExecuted
	defer func() { e.leave(call, outcome, out.Replayed, err) }()
	defer func() { err = schemaError(err) }()
	if err != nil {
		outcome = outcomeInvalid
		return Outcome{}, err
	}
	ref, owner := keystate.Ref{Scope: scope, Key: key}, e.owners.Next()
	out, outcome, done, err := m.check(ctx, ref, fp.value, owner)
	if done {
		if errors.Is(err, ErrKeyReused) && fp.legacy != nil {
			// The key may be stored under an older fingerprint version,
			// which Redis keeps only as a digest: ask again with it.
			outcome = outcomeAskedAgain
			return e.execute(ctx, m, scope, key, fingerprint{value: fp.legacy()}, handler, request, fn)
		}
		return out, err
	}

	x := e.newExecution(m, ref, owner, handler, request)
	x.fingerprint = fp.value
	held, claimed, err := m.claim(ctx, x)
	var inFlight *InFlightError
	switch {
	case errors.As(err, &inFlight):
		outcome = outcomeInFlight
		return Outcome{}, err
	case err != nil:
		outcome = outcomeUnavailable
		if callerLeft(ctx, m) {
			return Outcome{}, ctx.Err()
		}
		return Outcome{}, unavailable(err)
	case !claimed:
		if legacy := fp.legacyFor(held.Fingerprint); legacy != "" {
			outcome = outcomeAskedAgain
			return e.execute(ctx, m, scope, key, fingerprint{value: legacy}, handler, request, fn)
		}
		out, outcome, err = e.answerHeld(held, fp.value)
		return out, err
	}
	if callerLeft(ctx, m) {
		// The caller left while the claim ran: give the key back now.
		x.discard(ctx)
		e.abandon(ctx, x, endFor(x.anyStep(), false))
		outcome = outcomeFailed
		return Outcome{}, ctx.Err()
	}
	out, outcome, err = e.run(ctx, x, fn)
	return out, err
}

// callerLeft reports whether the caller went away (ctx ended) from an
// execution whose transaction the engine owns: it then gets ctx's error.
// In the caller's own transaction (DoTx) the caller decides what its end
// means, and gets the error of what failed.
func callerLeft(ctx context.Context, m mode) bool {
	return !m.callerCommits() && ctx.Err() != nil
}

// newExecution returns an execution in mode m of ref for owner, which has
// not claimed its key yet. Every request makes one, a replay too, so its
// step maps are made only when a step is recorded (setStep).
func (e *Engine) newExecution(m mode, ref keystate.Ref, owner keystate.Owner, handler string, request func() []byte) *Execution {
	return &Execution{engine: e, mode: m, ref: ref, fence: Fence{Owner: owner}, handler: handler, request: request, by: byFirst}
}

// checkCache asks Redis first, claiming the key there provisionally for
// owner when it is free. done is true when Redis answered the request.
func (e *Engine) checkCache(ctx context.Context, ref keystate.Ref, fingerprint string, owner keystate.Owner) (Outcome, string, bool, error) {
	if e.cache == nil {
		return Outcome{}, "", false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
	rctx, span := e.startSpan(rctx, spanCheck)
	res, err := e.cache.Check(rctx, ref, fingerprint, owner, e.cfg.LeaseTimeout)
	if span.IsRecording() {
		span.SetAttributes(attrVerdict.String(res.Verdict.String()))
	}
	endSpan(span, err)
	cancel()
	if err != nil {
		e.redisFailed(redisOpCheck, err)
		return Outcome{}, "", false, nil
	}
	return answerCached(res)
}

// readCache asks Redis without claiming anything there (a caller's
// transaction holds the key: a provisional claim would outlive it). done
// is true when Redis answered the request.
func (e *Engine) readCache(ctx context.Context, ref keystate.Ref, fingerprint string) (Outcome, string, bool, error) {
	if e.cache == nil {
		return Outcome{}, "", false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
	res, err := e.cache.Peek(rctx, ref, fingerprint)
	cancel()
	if err != nil {
		if !errors.Is(err, cache.ErrCorrupt) {
			e.redisFailed(redisOpCheck, err)
		}
		return Outcome{}, "", false, nil // Redis is a cache: Postgres answers when it cannot
	}
	return answerCached(res)
}

// answerCached turns Redis's verdict into the request's answer; done is
// false when Postgres must answer.
func answerCached(res cache.CheckResult) (out Outcome, outcome string, done bool, err error) {
	switch res.Verdict {
	case cache.Replay:
		if res.Entry.BodyInPostgres {
			return Outcome{}, "", false, nil // Postgres answers with the body
		}
		return Outcome{Result: Result(res.Entry.Response), Replayed: true}, outcomeReplayedCache, true, nil
	case cache.InFlight:
		return Outcome{}, outcomeInFlight, true, inFlight(res.RetryAfter)
	case cache.Mismatch:
		return Outcome{}, outcomeReused, true, ErrKeyReused
	case cache.Claimed, cache.Undecided:
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
		return Outcome{Result: Result(k.Response), Replayed: true}, outcomeReplayedDB, nil
	case keystate.InProgress:
		return Outcome{}, outcomeInFlight, inFlight(k.LeaseRemaining)
	case keystate.Failed:
	}
	// failed between our claim and our read: the next try claims it.
	return Outcome{}, outcomeInFlight, inFlight(time.Second)
}

// run executes fn as x, which holds its key since x.claimedAt, and
// records the result: a stored result completes the key in the execution's
// transaction; otherwise the key is failed (retryable), or handed off for a
// resumption when a step may have had an effect the key must not forget.
// fn's own error comes back as an *ExecutionError that says which.
func (e *Engine) run(ctx context.Context, x *Execution, fn Func) (out Outcome, outcome string, err error) {
	outcome = outcomePanic // unless run returns: a panic of fn goes on up
	defer func() { e.finished(ctx, x, outcome, err) }()
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	x.lease = x.mode.hold(ctx, x, func() { cancel(ErrLeaseLost) })
	defer e.leases.Release(x.lease)
	if !x.lease.Valid() {
		// Claimed more than a lease ago (a resumption whose batch was slow
		// to start it): the handler never starts.
		x.discard(ctx)
		return Outcome{}, outcomeLeaseLost, e.releaseLost(ctx, x)
	}
	hctx = context.WithValue(hctx, executionKey{}, x)

	sctx, span := e.startSpan(hctx, spanHandler)
	res, handleErr := e.call(sctx, x, fn)
	endSpan(span, handleErr)
	if res.Status == 0 {
		res.Status = http.StatusOK
	}
	if handleErr == nil && e.cfg.ShouldStore(res.Status) {
		// The completion goes with ctx, bounded by a lease as a claim is,
		// not with hctx, which ends with the lease: Postgres fences the
		// completion (the owner; the one-commit transaction's lock), and
		// once it landed the key is no longer held, so no renewal extends
		// the lease any more and the next one gives it up — a lease that
		// ended while the answer was on its way must not cut it off and
		// tell the caller ErrLeaseLost of a committed execution. (In the
		// caller's transaction, which no lease holds, the caller's ctx alone
		// bounds it, as before.)
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if x.lease != nil {
			cctx, cancel = context.WithTimeout(ctx, e.cfg.LeaseTimeout)
		}
		stored, committed, err := e.complete(cctx, x, res)
		cancel()
		switch {
		case err == nil:
			if committed {
				e.writeThrough(ctx, stored)
			}
			return Outcome{Result: res}, outcomeExecuted, nil
		case x.lostLease(hctx, err):
			return Outcome{}, outcomeLeaseLost, e.releaseLost(ctx, x)
		}
		// The commit (or begin) failed; whether a commit that lost its
		// connection went through is unknown, so the key is left to the
		// lease if abandon cannot run either, and the client retries. The
		// store failed, not the handler: no failure is counted.
		e.abandon(ctx, x, endFor(x.anyStep(), false))
		if callerLeft(ctx, x.mode) {
			return Outcome{}, outcomeFailed, ctx.Err()
		}
		return Outcome{}, outcomeUnavailable, unavailable(err)
	}
	x.discard(ctx)
	switch {
	case x.lostLease(hctx, handleErr):
		return Outcome{}, outcomeLeaseLost, e.releaseLost(ctx, x)
	case handleErr == nil:
		// A deliberate answer that is not stored: retryable, unless a step
		// is unsettled and must be finished first. It counts as a failure,
		// and is the caller's answer, not an error.
		e.abandon(ctx, x, endFor(x.unsettled(), true))
		return Outcome{Result: res}, outcomeFailed, nil
	}
	// A handler that failed because its caller left (a canceled context)
	// is not counted against the key. One that stepped is handed off, a
	// step's effect must not be forgotten, unless it says its steps had
	// none and none is unsettled.
	left := callerLeft(ctx, x.mode)
	handOff := x.unsettled() || (x.anyStep() && !errors.Is(handleErr, ErrNoEffect))
	handedOff, failures := e.abandon(ctx, x, endFor(handOff, !left))
	if left {
		return Outcome{}, outcomeFailed, ctx.Err()
	}
	return Outcome{}, outcomeHandlerError, &ExecutionError{Err: handleErr, HandedOff: handedOff, Failures: failures}
}

// call runs fn; a panic rolls the transaction back and abandons the key
// before it goes on.
func (e *Engine) call(ctx context.Context, x *Execution, fn Func) (Result, error) {
	defer func() {
		if p := recover(); p != nil {
			x.discard(ctx)
			e.abandon(ctx, x, endFor(x.anyStep(), true))
			panic(p)
		}
	}()
	return fn(ctx, x)
}

// finished counts an execution that ended with outcome, by who ran it, and
// logs its end: at Info when a takeover or the resumer finished it (the
// line operators read to see who finished an execution whose holder died
// or handed it off), at Debug for a first execution.
func (e *Engine) finished(ctx context.Context, x *Execution, outcome string, err error) {
	e.metrics.executions.WithLabelValues(x.by, outcome).Inc()
	msg, level := "execution finished", slog.LevelDebug
	switch x.by {
	case byResumer:
		msg, level = "execution resumed", slog.LevelInfo
	case byTakeover:
		level = slog.LevelInfo
	}
	if e.log.Enabled(ctx, level) {
		e.log.Log(ctx, level, msg, "scope", x.ref.Scope, "key", x.ref.Key, "handler", x.handler,
			"by", x.by, "outcome", outcome, "err", err)
	}
}

// complete stores res and completes the key with the handler's writes, in
// one round trip with the COMMIT where the engine commits. committed is
// false while the commit is still to come (the caller's).
func (e *Engine) complete(ctx context.Context, x *Execution, res Result) (stored keystate.Key, committed bool, err error) {
	ctx, span := e.startSpan(ctx, spanComplete)
	defer func() { endSpan(span, err) }()
	if !x.lease.Valid() {
		x.discard(ctx)
		return keystate.Key{}, false, ErrLeaseLost
	}
	return x.mode.complete(ctx, x, res)
}

// discard undoes the handler's writes ahead of the key's release. A
// single-commit execution keeps its transaction open, and with it the
// key's lock: its release rolls back to the execution's savepoint and
// writes the key's failed row in that transaction, so no other execution
// of the key runs in between (singleCommit.release).
func (x *Execution) discard(ctx context.Context) {
	if _, single := x.mode.(singleCommit); single {
		return
	}
	x.rollback(ctx)
}

// rollback rolls the execution's transaction back, if it began one, even
// when ctx has ended.
func (x *Execution) rollback(ctx context.Context) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tx != nil {
		_ = x.tx.Rollback(context.WithoutCancel(ctx))
	}
	if x.sqlTx != nil {
		_ = x.sqlTx.Rollback()
	}
}

// lostLease reports whether err, or the cause of ctx, says x lost its
// lease. An execution without a lease (the caller's transaction holds its
// key) loses none: an ErrLeaseLost its handler returns is another
// execution's, and an error like any other.
func (x *Execution) lostLease(ctx context.Context, err error) bool {
	return x.lease != nil && (errors.Is(err, ErrLeaseLost) || errors.Is(context.Cause(ctx), ErrLeaseLost))
}

// An ending is how an execution that has no stored result gives its key
// back (release).
type ending int

const (
	// endFailed fails the key; the store or the caller ended the
	// execution, so no failure is counted.
	endFailed ending = iota
	// endHandlerFailed fails the key and counts a failure of its handler
	// (Key.Failures).
	endHandlerFailed
	// endHandOff hands the key off for a resumption: a step may have had an
	// effect the key must not forget.
	endHandOff
)

// endFor returns the ending of an execution: a hand-off when handOff,
// else a fail, counted when handlerFailed.
func endFor(handOff, handlerFailed bool) ending {
	switch {
	case handOff:
		return endHandOff
	case handlerFailed:
		return endHandlerFailed
	}
	return endFailed
}

// abandon ends an execution that has no stored result as end says: the key
// is handed off for a resumption or failed, so a retry runs again. Both
// outlive ctx: a request canceled by its client must not leave the key
// claimed. When Postgres does not answer (it is what failed), the release
// goes on in the background until it lands or the lease is over
// (releaseLater), so the key is free for the next retry as soon as
// Postgres is back rather than when its lease ends.
//
// It reports whether the key was handed off and, when it was failed, the
// key's failures after it; 0 when they are not known: the fail went to the
// background, found nothing of x's left to fail, or wrote no row (DoTx).
func (e *Engine) abandon(ctx context.Context, x *Execution, end ending) (handedOff bool, failures int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	k, released, err := e.release(ctx, x, end)
	switch {
	case err == nil && released && end != endHandOff:
		return false, k.Failures
	case err == nil:
		return end == endHandOff, 0
	case !x.mode.keepsRow():
		// No row of x's holds the key: its transaction ended with Postgres.
		e.log.Warn("record a failed execution; a retry runs again", "scope", x.ref.Scope, "key", x.ref.Key, "err", err)
		return false, 0
	}
	// Postgres is what failed, likely what the handler answered for too: a
	// step's effect must not be forgotten, so an execution that stepped is
	// handed off (a resumption finishes it) rather than failed.
	if x.anyStep() {
		end = endHandOff
	}
	e.log.Warn("release key failed; trying again until Postgres answers or the lease ends",
		"scope", x.ref.Scope, "key", x.ref.Key, "hand_off", end == endHandOff, "err", err)
	e.releaseLater(ctx, x, end)
	return end == endHandOff, 0
}

// releaseLost releases the key of an execution that stopped because its
// lease was lost, and returns what its caller is told.
//
// An execution whose row holds the key is released in the background.
// When the lease was taken over, the release finds nothing of x's and ends
// at once. When x stopped because its renewals did not land (Postgres out
// of reach), its lease may still run in Postgres — a renewal sent before a
// partition can land after it, and extend it by a whole lease — and the
// release frees the key as soon as Postgres answers. The execution has
// stopped: it can no longer write. ErrLeaseLost.
//
// A single-commit execution that outran its lease still holds the key's
// lock in its transaction, unless Postgres ended it: the key is failed, a
// failure counted, before the lock goes (I13), and the caller is told
// ErrLeaseExpired, as an *ExecutionError carrying the key's failures (so
// Settle dead-letters a message that always overruns) — nothing took the
// key over. One whose commit was refused (the key has a row by now) is
// told ErrLeaseLost.
func (e *Engine) releaseLost(ctx context.Context, x *Execution) error {
	if _, single := x.mode.(singleCommit); single {
		_, failures := e.abandon(ctx, x, endHandlerFailed)
		if !x.lease.Valid() {
			return &ExecutionError{Err: ErrLeaseExpired, Failures: failures}
		}
		return ErrLeaseLost
	}
	if x.mode.keepsRow() {
		e.releaseLater(ctx, x, endFor(x.anyStep(), false))
	}
	return ErrLeaseLost
}

// releaseLater releases x's key in the background: at once, then on a
// backoff (releaseRetryFirst doubling to releaseRetryMax) until it lands,
// for two leases at most (by then a renewal sent before a partition has
// run out too, and the key is takeable anyway), or until the engine
// closes. The tries keep ctx's values, not its end. Once the engine is
// closed it tries nothing.
func (e *Engine) releaseLater(ctx context.Context, x *Execution, end ending) {
	e.releasesMu.Lock()
	defer e.releasesMu.Unlock()
	if e.closed {
		e.log.Warn("engine closed: the key stays claimed until its lease ends", "scope", x.ref.Scope, "key", x.ref.Key)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*e.cfg.LeaseTimeout)
	e.releases.Go(func() {
		defer cancel()
		go func() { // Close ends the tries, the one under way too
			select {
			case <-e.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		for pause := releaseRetryFirst; ; pause = min(2*pause, releaseRetryMax) {
			tctx, tcancel := context.WithTimeout(ctx, releaseTimeout)
			_, released, err := e.release(tctx, x, end)
			tcancel()
			switch {
			case err == nil && released:
				e.log.Info("key released in the background", "scope", x.ref.Scope, "key", x.ref.Key, "hand_off", end == endHandOff)
				return
			case err == nil:
				return // another execution holds the key: nothing of x's to release
			}
			if backoff.Sleep(ctx, pause) != nil {
				e.log.Warn("gave up releasing a key; it stays claimed until its lease ends", "scope", x.ref.Scope, "key", x.ref.Key, "err", err)
				return
			}
		}
	})
}

// Bounds of a release: one try's time, and the pauses between two tries
// of a release Postgres did not take.
const (
	releaseTimeout    = 5 * time.Second
	releaseRetryFirst = 250 * time.Millisecond
	releaseRetryMax   = 2 * time.Second
)

// release hands x's key off or fails it within ctx, as end says, and
// writes the new state through to Redis. It reports whether it released
// anything, and the key's new state: false with a nil error when the key is
// no longer x's; the error when Postgres did not answer.
func (e *Engine) release(ctx context.Context, x *Execution, end ending) (keystate.Key, bool, error) {
	k, released, err := x.mode.release(ctx, x, end)
	switch {
	case errors.Is(err, ErrLeaseLost):
		return keystate.Key{}, false, nil
	case err != nil:
		return keystate.Key{}, false, err
	case !released:
		return keystate.Key{}, false, nil
	}
	e.writeThrough(ctx, k)
	return k, true, nil
}

// writeThrough copies a transition this engine committed into Redis. A
// copy that did not land wakes the relays instead, unless the transaction
// notified them already (Tuning.NotifyInTransaction).
func (e *Engine) writeThrough(ctx context.Context, k keystate.Key) {
	if e.applyCache(ctx, k) || e.cfg.Tuning.NotifyInTransaction {
		return
	}
	e.wake.Kick()
}

// applyCache writes a Postgres state through to Redis, best effort: the
// relay delivers it anyway. It reports whether Redis took the write (or
// already held it).
func (e *Engine) applyCache(ctx context.Context, k keystate.Key) bool {
	if e.cache == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RedisTimeout)
	defer cancel()
	if _, err := e.cache.Apply(ctx, k); err != nil {
		e.redisFailed(redisOpApply, err)
		return false
	}
	return true
}

// releaseCache drops this request's provisional claim, best effort.
func (e *Engine) releaseCache(ctx context.Context, ref keystate.Ref, owner keystate.Owner) {
	if e.cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RedisTimeout)
	defer cancel()
	if _, err := e.cache.Release(ctx, ref, owner); err != nil {
		e.redisFailed(redisOpRelease, err)
	}
}

func (e *Engine) redisFailed(op string, err error) {
	e.metrics.redisFallback.WithLabelValues(op).Inc()
	e.log.Debug("redis unavailable, carrying on from Postgres", "op", op, "err", err)
}

// newTx returns an execution's transaction, not yet begun; prepare, when
// not nil, runs on its connection before the BEGIN.
func (e *Engine) newTx(prepare func(ctx context.Context, conn *pgx.Conn) error) *exectx.Tx {
	return exectx.New(exectx.Options{
		Pool: e.cfg.Pool, Unavailable: ErrUnavailable, CommitRefused: ErrCommitByHandler, Prepare: prepare, Log: e.log,
	})
}
