// Package relay carries outbox events from Postgres to the Redis cache.
//
// Every transition of an idempotency key writes an outbox row in the
// transaction that makes it, and a NOTIFY wakes the relays (in that
// transaction, or after it when the engine's own write-through to Redis
// failed). The relay wakes on the notification (when it has a session to
// LISTEN on, Config.Listen) or on its poll timer (so a lost notification
// strands nothing). In one round trip it begins a transaction and takes a
// batch of events with FOR UPDATE SKIP LOCKED together with the keys'
// current rows, applies the rows to Redis in one pipeline of versioned
// apply calls, and only then commits the deletion of the events (no event
// is lost). A crash anywhere before the commit puts the events back; the
// redelivery is harmless because the apply script never lowers a key's
// version (no version regression in Redis), which is also why up to
// Config.InFlight batches of one relay, and any number of relays, may run
// at once.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/onceonly/backoff"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/startstop"
)

// Defaults of Config.
const (
	DefaultBatchSize    = 500
	DefaultPollInterval = time.Second
	DefaultMaxAttempts  = 10
	DefaultBatchTimeout = 5 * time.Second
	DefaultInFlight     = 2
)

// Config configures a Relay.
type Config struct {
	// Pool is the Postgres pool holding the outbox (required).
	Pool *pgxpool.Pool
	// Redis is the cache's Redis (required): a client, a cluster client or
	// a Sentinel failover client.
	Redis redis.UniversalClient
	// RedisPrefix prefixes every Redis key; it must be the engine's
	// Config.RedisPrefix (cache.DefaultPrefix, "idem:", when empty).
	RedisPrefix string
	// RedisWriteLayout1 is the rolling-upgrade switch of the engine's
	// Tuning.RedisWriteLayout1 (REDIS_WRITE_LAYOUT1): set it on every
	// process alike, and unset it once no release before 2026-11-24 runs.
	RedisWriteLayout1 bool
	// BatchSize is the most events one batch takes (RELAY_BATCH).
	BatchSize int
	// PollInterval is how often the relay looks for events without being
	// notified (RELAY_POLL_INTERVAL).
	PollInterval time.Duration
	// Listen, when set, is a session-capable connection (straight to
	// Postgres, or through a session pool: DATABASE_SESSION_URL) on which
	// the relay LISTENs, to deliver as soon as events are written. Without
	// it the relay only polls: Pool may go through PgBouncer in transaction
	// mode, where a LISTEN hears nothing.
	Listen *pgx.ConnConfig
	// InFlight is how many batches the relay may have under way at once
	// (RELAY_IN_FLIGHT, DefaultInFlight): while one batch is applied to
	// Redis the next is taken from Postgres, so neither waits for the
	// other. A second batch is taken while one is under way only when that
	// one came back full, or a notification or poll tick arrived meanwhile.
	InFlight int
	// MaxAttempts is how many times an event that cannot be applied is
	// tried before it is parked.
	MaxAttempts int
	// MaxCachedBody is the largest response body copied into Redis; it must
	// match the engine's (cache.DefaultMaxBody when zero).
	MaxCachedBody int
	// BatchTimeout bounds one batch. A batch running when the relay stops
	// (Run's or Start's context ends, or Stop is called) still gets this
	// long to finish; otherwise it is rolled back and its events stay in
	// the outbox.
	BatchTimeout time.Duration
	// WaitReplicas, when positive, is how many Redis replicas must hold a
	// batch's writes before its events are deleted (RELAY_REDIS_WAIT_REPLICAS;
	// the relay command sets 1 under Sentinel): a replica Sentinel promotes
	// then holds every event the relay deleted. A batch that reaches fewer
	// within WaitTimeout keeps its events and is tried again, so while fewer
	// replicas are up the outbox grows (the api serves on, from Postgres
	// and the engine's write-through). It needs one Redis primary, not a
	// cluster.
	WaitReplicas int
	// WaitTimeout bounds that wait (DefaultWaitTimeout; keep it below
	// BatchTimeout).
	WaitTimeout time.Duration
	// Logger receives the relay's logs (slog.Default when nil).
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// Relay delivers outbox events to Redis: Run blocks until its context ends;
// Start and Stop run it in the background.
type Relay struct {
	life    startstop.Base
	cfg     Config
	store   *outbox.Store
	cache   *cache.Cache
	log     *slog.Logger
	metrics *metrics
	wake    chan struct{}
	// outage counts the failed batches since the last delivered one, across
	// the workers, so that recovery is logged once.
	outage outage
	// replicas, when set, holds every batch until Redis replicas have it.
	replicas *replicaWait
	// afterPush, when set (tests), runs after Redis acknowledged a batch
	// and before its deletion commits; an error aborts the batch as a crash
	// at that point would.
	afterPush func() error
	// delivered, when set (benchmarks), sees every committed batch.
	delivered func(events []outbox.Event, failed []outbox.FailedEvent, at batchTimes)
}

// New returns a Relay.
func New(cfg Config) (*Relay, error) {
	if cfg.Pool == nil || cfg.Redis == nil {
		return nil, errors.New("relay: Pool and Redis are required")
	}
	defaults.Positive(&cfg.BatchSize, DefaultBatchSize)
	defaults.Positive(&cfg.PollInterval, DefaultPollInterval)
	defaults.Positive(&cfg.MaxAttempts, DefaultMaxAttempts)
	defaults.Positive(&cfg.InFlight, DefaultInFlight)
	defaults.Positive(&cfg.MaxCachedBody, cache.DefaultMaxBody)
	defaults.Positive(&cfg.BatchTimeout, DefaultBatchTimeout)
	defaults.Positive(&cfg.WaitTimeout, DefaultWaitTimeout)
	defaults.Logger(&cfg.Logger)
	c := cache.New(cfg.Redis, cache.Options{Prefix: cfg.RedisPrefix, MaxBody: cfg.MaxCachedBody, WriteLayout1: cfg.RedisWriteLayout1})
	replicas, err := newReplicaWait(cfg, c)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	return &Relay{
		cfg:     cfg,
		store:   outbox.New(outbox.Config{}),
		cache:   c,
		log:     cfg.Logger,
		metrics: m,
		wake:    make(chan struct{}, 1),

		replicas: replicas,
	}, nil
}

// Run delivers events until ctx ends (or Stop is called): on every
// notification, on every poll tick, and straight on while batches come back
// full, with up to InFlight batches under way at once. Postgres or Redis
// failures are retried with jittered exponential backoff; the events wait
// in the outbox. It returns nil after a graceful stop: the batches under
// way finish (within BatchTimeout) and no other starts.
func (r *Relay) Run(ctx context.Context) error {
	return startstop.Run(ctx, r)
}

// Start starts delivering in the background, as Run does, and returns at
// once; delivery ends when ctx ends or at Stop. Starting a running relay
// does nothing.
func (r *Relay) Start(ctx context.Context) error {
	ctx, ok, started, stopped := r.life.StartInit(ctx)
	if !ok {
		return nil
	}
	go func() {
		defer stopped()
		r.deliver(ctx, started)
	}()
	return nil
}

// Stop ends delivery and returns once the batches under way have finished
// (within BatchTimeout). It is safe to call twice, or without Start.
func (r *Relay) Stop() { r.life.Stop() }

// Started returns a channel closed once the relay has started.
func (r *Relay) Started() <-chan struct{} { return r.life.Started() }

// Stopped returns a channel closed once the relay started last has
// stopped (closed already when it is not running).
func (r *Relay) Stopped() <-chan struct{} { return r.life.Stopped() }

// deliver is the relay's loop (see Run); started is called once its
// goroutines are under way.
func (r *Relay) deliver(ctx context.Context, started func()) {
	var wg sync.WaitGroup
	if r.cfg.Listen != nil {
		wg.Go(func() { r.listen(ctx) })
	}
	wg.Go(func() { r.countEvents(ctx) })
	wg.Go(func() { r.pollEvery(ctx) })
	for range r.cfg.InFlight {
		wg.Go(func() { r.work(ctx) })
	}
	r.poke() // look at once
	started()
	wg.Wait()
}

// pollEvery wakes a worker every PollInterval until ctx ends, so a lost
// notification strands nothing.
func (r *Relay) pollEvery(ctx context.Context) {
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.poke()
		}
	}
}

// work is one of deliver's InFlight workers: woken, it delivers batches while
// they come back full, retrying failures with backoff, until ctx ends.
func (r *Relay) work(ctx context.Context) {
	retry := backoff.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		for {
			taken, err := r.drain(ctx)
			if err == nil || ctx.Err() != nil {
				if err == nil && taken > 0 {
					// Only a batch that delivered events ends an outage: an
					// empty one (another worker holds the events) says
					// nothing about Redis.
					r.recovered()
				}
				retry.Reset()
				break
			}
			if errors.Is(err, ErrReplicasBehind) {
				retry.Reset() // the batch has waited already: try again soon
			}
			r.outage.fail(time.Now())
			d := retry.Next()
			r.log.Warn("relay batch failed, retrying", "err", err, "retry_in", d.String())
			if backoff.Sleep(ctx, d) != nil {
				return
			}
		}
	}
}

// outage is a run of failed batches: how many, and since when.
type outage struct {
	mu    sync.Mutex
	n     int
	since time.Time
}

// fail counts a failed batch at now.
func (o *outage) fail(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == 0 {
		o.since = now
	}
	o.n++
}

// end ends the run: it returns how many batches failed and since when,
// n 0 when none did.
func (o *outage) end() (n int, since time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, since = o.n, o.since
	o.n = 0
	return n, since
}

// recovered logs, once, that batches are delivered again after failures:
// the warnings said each retry, this says the outage is over.
func (r *Relay) recovered() {
	if n, since := r.outage.end(); n > 0 {
		d := time.Since(since).Round(time.Millisecond)
		r.log.Info(fmt.Sprintf("relay delivering again: recovered after %d failures for %s", n, d),
			"failures", n, "outage", d.String())
	}
}

// drain delivers batches while they come back full; each full one wakes
// another worker to take the next batch while this one is applied. It
// returns how many events its batches took.
func (r *Relay) drain(ctx context.Context) (int, error) {
	taken := 0
	for ctx.Err() == nil {
		b, err := r.deliverBatch(ctx, r.poke)
		taken += b.taken
		if err != nil || b.taken < r.cfg.BatchSize {
			return taken, err
		}
	}
	return taken, nil
}

// Drain delivers batches until none is pending, with up to InFlight under
// way at once (a second starts when a batch comes back full), and returns
// how many events it published. After the first failure it starts no
// batch, and returns the failures once the batches under way are done.
func (r *Relay) Drain(ctx context.Context) (published int, err error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		running int
		stopped atomic.Bool
		errs    []error
	)
	var start func()
	start = func() {
		mu.Lock()
		defer mu.Unlock()
		if running == r.cfg.InFlight || stopped.Load() {
			return
		}
		running++
		wg.Go(func() {
			n, err := r.drainUntilEmpty(ctx, &stopped, start)
			mu.Lock()
			defer mu.Unlock()
			running--
			published += n
			if err != nil {
				errs = append(errs, err)
				stopped.Store(true)
			}
		})
	}
	start()
	wg.Wait()
	return published, errors.Join(errs...)
}

// drainUntilEmpty delivers batches until one comes back empty, or fails, or
// stopped is set; full runs when a batch comes back full.
func (r *Relay) drainUntilEmpty(ctx context.Context, stopped *atomic.Bool, full func()) (published int, err error) {
	for !stopped.Load() {
		b, err := r.deliverBatch(ctx, full)
		published += b.published
		if err != nil || b.taken == 0 {
			return published, err
		}
	}
	return published, nil
}

// batchResult counts what one batch did. Deferred events (Redis could not
// serve their keys) are among the failed ones.
type batchResult struct {
	taken, published, failed, deferred, parked int
}

// deliverBatch takes one batch of events with their keys' current rows,
// applies the rows to Redis and commits the events' deletion once Redis
// acknowledged them. Events Redis refused are requeued (or parked) in the
// same transaction. A batch that comes back full calls full (when not nil)
// before it is applied.
func (r *Relay) deliverBatch(ctx context.Context, full func()) (batchResult, error) {
	if ctx.Err() != nil {
		return batchResult{}, ctx.Err()
	}
	// A batch that started finishes even when ctx ends, within BatchTimeout.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()

	var (
		res            batchResult
		batch          outbox.Batch
		failed         []outbox.FailedEvent
		taken, ackedAt time.Time
		span           = noSpan
	)
	defer func() { endBatchSpan(span, res) }()
	began := time.Now()
	tx, batch, err := r.store.TakeBatch(bctx, r.cfg.Pool, r.cfg.BatchSize, r.cfg.MaxCachedBody)
	switch {
	case err != nil:
		err = stageErr(stagePostgres, err)
	case len(batch.Events) == 0:
		// An empty poll is no span and commits nothing (TakeBatch ended
		// its transaction).
	default:
		taken = time.Now()
		res.taken = len(batch.Events)
		if res.taken == r.cfg.BatchSize && full != nil {
			full()
		}
		var sctx context.Context
		sctx, span = tracer.Start(bctx, "onceonly.relay.batch", trace.WithTimestamp(began))
		failed, ackedAt, err = r.push(sctx, tx, batch, &res)
	}
	if err != nil {
		if se, ok := errors.AsType[*stageError](err); ok {
			r.metrics.errors.WithLabelValues(se.stage).Inc()
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return batchResult{}, fmt.Errorf("deliver batch: %w", err)
	}
	if res.taken == 0 {
		return res, nil
	}
	r.observe(res, batch.Events, failed, ackedAt)
	if r.delivered != nil {
		r.delivered(batch.Events, failed, batchTimes{began: began, taken: taken, acked: ackedAt})
	}
	// The rest of the batch is delivered; the caller backs off before
	// trying the keys Redis could not serve again.
	for _, f := range failed {
		if f.Unavailable {
			res.deferred++
		}
	}
	if res.deferred > 0 {
		r.metrics.errors.WithLabelValues(stageRedis).Inc()
		return res, fmt.Errorf("deliver batch: %d of %d events wait for Redis: %w", res.deferred, res.taken, firstUnavailable(failed))
	}
	return res, nil
}

// batchTimes is when a batch began (its take was sent), was taken (the
// events and rows came back) and was acknowledged by Redis.
type batchTimes struct{ began, taken, acked time.Time }

// push applies batch to Redis, requeues what Redis refused and commits tx,
// the deletion of the events; on a failure it rolls tx back, which puts
// every event back. It returns the refused events and when Redis
// acknowledged the batch.
func (r *Relay) push(ctx context.Context, tx pgx.Tx, batch outbox.Batch, res *batchResult) (failed []outbox.FailedEvent, ackedAt time.Time, err error) {
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // the error returned says what went wrong
		}
	}()
	results, err := r.cache.ApplyBatch(ctx, batch.Updates)
	if err != nil {
		return nil, time.Time{}, stageErr(stageRedis, err)
	}
	if r.replicas != nil {
		if err := r.replicas.wait(ctx); err != nil {
			return nil, time.Time{}, stageErr(stageReplicas, err)
		}
	}
	ackedAt = time.Now()
	if r.afterPush != nil {
		if err := r.afterPush(); err != nil {
			return nil, time.Time{}, err
		}
	}
	failed = r.failedEvents(batch, results)
	if res.parked, err = r.store.Requeue(ctx, tx, failed, r.cfg.MaxAttempts); err != nil {
		return nil, time.Time{}, stageErr(stagePostgres, err)
	}
	committed = true // a failed commit has ended the transaction too
	if err := tx.Commit(ctx); err != nil {
		return nil, time.Time{}, stageErr(stagePostgres, fmt.Errorf("commit: %w", err))
	}
	res.failed = len(failed)
	res.published = res.taken - res.failed
	return failed, ackedAt, nil
}

// firstUnavailable returns the error of the first event deferred for want
// of Redis.
func firstUnavailable(failed []outbox.FailedEvent) error {
	for _, f := range failed {
		if f.Unavailable {
			return f.Err
		}
	}
	return nil
}

// failedEvents returns the events whose key's update Redis refused, and
// logs each.
func (r *Relay) failedEvents(batch outbox.Batch, results []cache.ApplyResult) []outbox.FailedEvent {
	var refused map[keystate.Ref]error
	for i, res := range results {
		if res.Err != nil {
			if refused == nil {
				refused = map[keystate.Ref]error{}
			}
			refused[batch.Updates[i].Ref] = res.Err
		}
	}
	if len(refused) == 0 {
		return nil
	}
	var failed []outbox.FailedEvent
	for _, e := range batch.Events {
		err, ok := refused[e.Ref()]
		if !ok {
			continue
		}
		unavailable := errors.Is(err, cache.ErrUnavailable)
		failed = append(failed, outbox.FailedEvent{Event: e, Err: err, Unavailable: unavailable})
		if unavailable {
			continue // counted and logged once for the batch
		}
		r.metrics.errors.WithLabelValues(stageEvent).Inc()
		if e.Attempts+1 >= r.cfg.MaxAttempts {
			r.log.Error("outbox event parked: it cannot be applied", "event_id", e.ID,
				"scope", e.Scope, "key", e.Key, "version", e.Version, "attempts", e.Attempts+1, "err", err)
		} else {
			r.log.Warn("outbox event not applied, requeued", "event_id", e.ID,
				"scope", e.Scope, "key", e.Key, "version", e.Version, "attempts", e.Attempts+1, "err", err)
		}
	}
	return failed
}

// observe records a committed batch in the metrics. The lag of an event runs
// from its write in Postgres (the Postgres clock) to Redis acknowledging it
// (this process's clock).
func (r *Relay) observe(res batchResult, events []outbox.Event, failed []outbox.FailedEvent, ackedAt time.Time) {
	if res.taken == 0 {
		return
	}
	r.metrics.batchSize.Observe(float64(res.taken))
	r.metrics.published.Add(float64(res.published))
	r.metrics.parked.Add(float64(res.parked))
	var refused map[int64]bool
	if len(failed) > 0 {
		refused = make(map[int64]bool, len(failed))
		for _, f := range failed {
			refused[f.ID] = true
		}
	}
	for _, e := range events {
		if !refused[e.ID] {
			r.metrics.lag.Observe(max(ackedAt.Sub(e.CreatedAt), 0).Seconds())
		}
	}
}

// listen keeps a LISTEN connection open and pokes the delivery loop on every
// notification, and after every (re)connect, since notifications sent while
// it was away are lost.
func (r *Relay) listen(ctx context.Context) {
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	failures := 0
	var since time.Time
	connected := func() {
		if failures > 0 {
			d := time.Since(since).Round(time.Millisecond)
			r.log.Info(fmt.Sprintf("relay listening again: recovered after %d failures for %s", failures, d),
				"failures", failures, "outage", d.String())
		}
		failures = 0
		retry.Reset()
	}
	for {
		err := r.listenOnce(ctx, connected)
		if ctx.Err() != nil {
			return
		}
		if failures == 0 {
			since = time.Now()
		}
		failures++
		r.metrics.errors.WithLabelValues(stageListen).Inc()
		d := retry.Next()
		r.log.Warn("relay lost its LISTEN connection, reconnecting", "err", err, "retry_in", d.String())
		if backoff.Sleep(ctx, d) != nil {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.cfg.Listen.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	connected()
	r.poke()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		r.poke()
	}
}

// poke wakes the delivery loop; pokes that arrive while one is pending
// merge.
func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// countInterval is how often the backlog's gauges are refreshed.
const countInterval = 5 * time.Second

// countEvents refreshes the backlog's gauges (pending, parked, the oldest
// pending event's age) until ctx ends.
func (r *Relay) countEvents(ctx context.Context) {
	t := time.NewTicker(countInterval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, countInterval)
		counts, err := r.store.CountEvents(cctx, r.cfg.Pool)
		cancel()
		if err == nil {
			r.metrics.pendingEvents.Set(float64(counts.Pending))
			r.metrics.parkedEvents.Set(float64(counts.Parked))
			r.metrics.oldestPending.Set(counts.OldestPending.Seconds())
		} else if ctx.Err() == nil {
			r.metrics.errors.WithLabelValues(stageCount).Inc()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stageError records where a batch failed, for the errors metric.
type stageError struct {
	stage string
	err   error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

// stageErr wraps a non-nil err with its stage.
func stageErr(stage string, err error) error {
	if err == nil {
		return nil
	}
	return &stageError{stage: stage, err: err}
}
