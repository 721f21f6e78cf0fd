// Package relay carries outbox events from Postgres to the Redis cache.
//
// Every transition of an idempotency key writes an outbox row and a NOTIFY in
// the transaction that makes it. The relay wakes on the notification (when
// it has a session to LISTEN on, Config.Listen) or on its poll timer (so a
// lost notification strands nothing), takes a batch of
// events with FOR UPDATE SKIP LOCKED, reads the keys' current rows, applies
// them to Redis in one pipeline of versioned apply calls, and only then
// commits the deletion of the events (I9). A crash anywhere before the
// commit puts the events back; the redelivery is harmless because the apply
// script never lowers a key's version (I8). Any number of relays may run.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/backoff"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// Defaults of Config.
const (
	DefaultBatchSize    = 500
	DefaultPollInterval = time.Second
	DefaultMaxAttempts  = 10
	DefaultBatchTimeout = 5 * time.Second
)

// Config configures a Relay.
type Config struct {
	// Pool is the Postgres pool holding the outbox (required).
	Pool *pgxpool.Pool
	// Cache is the Redis cache to deliver to (required).
	Cache *cache.Cache
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
	// MaxAttempts is how many times an event that cannot be applied is
	// tried before it is parked.
	MaxAttempts int
	// MaxCachedBody is the largest response body copied into Redis; it must
	// match the engine's (cache.DefaultMaxBody when zero).
	MaxCachedBody int
	// BatchTimeout bounds one batch. A batch running when Run's context
	// ends still gets this long to finish; otherwise it is rolled back and
	// its events stay in the outbox.
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

// Relay delivers outbox events to Redis.
type Relay struct {
	cfg     Config
	store   *outbox.Store
	log     *slog.Logger
	metrics *metrics
	wake    chan struct{}
	// replicas, when set, holds every batch until Redis replicas have it.
	replicas *replicaWait
	// afterPush, when set (tests), runs after Redis acknowledged a batch
	// and before its deletion commits; an error aborts the batch as a crash
	// at that point would.
	afterPush func() error
	// delivered, when set (benchmarks), sees every committed batch.
	delivered func(events []outbox.Event, failed []outbox.FailedEvent, ackedAt time.Time)
}

// New returns a Relay.
func New(cfg Config) (*Relay, error) {
	if cfg.Pool == nil || cfg.Cache == nil {
		return nil, errors.New("relay: Pool and Cache are required")
	}
	defaults.Positive(&cfg.BatchSize, DefaultBatchSize)
	defaults.Positive(&cfg.PollInterval, DefaultPollInterval)
	defaults.Positive(&cfg.MaxAttempts, DefaultMaxAttempts)
	defaults.Positive(&cfg.MaxCachedBody, cache.DefaultMaxBody)
	defaults.Positive(&cfg.BatchTimeout, DefaultBatchTimeout)
	defaults.Positive(&cfg.WaitTimeout, DefaultWaitTimeout)
	defaults.Logger(&cfg.Logger)
	replicas, err := newReplicaWait(cfg)
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
		log:     cfg.Logger,
		metrics: m,
		wake:    make(chan struct{}, 1),

		replicas: replicas,
	}, nil
}

// Run delivers events until ctx ends: on every notification, on every poll
// tick, and straight on while batches come back full. Postgres or Redis
// failures are retried with jittered exponential backoff; the events wait in
// the outbox. It returns nil after a graceful stop.
func (r *Relay) Run(ctx context.Context) error {
	done := make(chan struct{})
	defer func() { <-done; <-done }()
	go func() {
		defer func() { done <- struct{}{} }()
		if r.cfg.Listen != nil {
			r.listen(ctx)
		}
	}()
	go func() { defer func() { done <- struct{}{} }(); r.countEvents(ctx) }()

	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	retry := backoff.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}
	for {
		if _, err := r.drain(ctx); err != nil && ctx.Err() == nil {
			if errors.Is(err, ErrReplicasBehind) {
				retry.Reset() // the batch has waited already: try again soon
			}
			d := retry.Next()
			r.log.Warn("relay batch failed, retrying", "err", err, "retry_in", d.String())
			if backoff.Sleep(ctx, d) != nil {
				return nil
			}
			continue
		}
		retry.Reset()
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-poll.C:
		}
	}
}

// Drain delivers batches until none is pending and returns how many events
// it published. It stops at the first failure.
func (r *Relay) Drain(ctx context.Context) (published int, err error) {
	for {
		b, err := r.deliverBatch(ctx)
		published += b.published
		if err != nil {
			return published, err
		}
		if b.taken == 0 {
			return published, nil
		}
	}
}

// drain delivers batches while they come back full.
func (r *Relay) drain(ctx context.Context) (published int, err error) {
	for ctx.Err() == nil {
		b, err := r.deliverBatch(ctx)
		published += b.published
		if err != nil || b.taken < r.cfg.BatchSize {
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

// deliverBatch takes one batch of events, applies the keys' current rows to
// Redis and commits the events' deletion once Redis acknowledged them.
// Events Redis refused are requeued (or parked) in the same transaction.
func (r *Relay) deliverBatch(ctx context.Context) (batchResult, error) {
	if ctx.Err() != nil {
		return batchResult{}, ctx.Err()
	}
	// A batch that started finishes even when ctx ends, within BatchTimeout.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()

	var (
		res     batchResult
		events  []outbox.Event
		failed  []outbox.FailedEvent
		ackedAt time.Time
		span    = noSpan
	)
	defer func() { endBatchSpan(span, res) }()
	began := time.Now()
	err := pgx.BeginFunc(bctx, r.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		events, err = r.store.TakeEvents(bctx, tx, r.cfg.BatchSize)
		if err != nil || len(events) == 0 {
			return stageErr(stagePostgres, err)
		}
		// A batch is traced once it holds events: an empty poll is no span.
		var sctx context.Context
		sctx, span = tracer.Start(bctx, "onceonly.relay.batch", trace.WithTimestamp(began))
		res.taken = len(events)
		refs, updates, err := r.updates(sctx, tx, events)
		if err != nil {
			return stageErr(stagePostgres, err)
		}
		results, err := r.cfg.Cache.ApplyBatch(sctx, updates)
		if err != nil {
			return stageErr(stageRedis, err)
		}
		if r.replicas != nil {
			if err := r.replicas.wait(sctx); err != nil {
				return stageErr(stageReplicas, err)
			}
		}
		ackedAt = time.Now()
		if r.afterPush != nil {
			if err := r.afterPush(); err != nil {
				return err
			}
		}
		failed = r.failedEvents(events, refs, results)
		res.parked, err = r.store.Requeue(sctx, tx, failed, r.cfg.MaxAttempts)
		res.failed = len(failed)
		res.published = res.taken - res.failed
		return stageErr(stagePostgres, err)
	})
	if err != nil {
		if se, ok := errors.AsType[*stageError](err); ok {
			r.metrics.errors.WithLabelValues(se.stage).Inc()
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return batchResult{}, fmt.Errorf("deliver batch: %w", err)
	}
	r.observe(res, events, failed, ackedAt)
	if r.delivered != nil && res.taken > 0 {
		r.delivered(events, failed, ackedAt)
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

// updates reads the current row of every key in events, once per key, and
// returns the cache updates in the order of refs. A key gone from Postgres
// becomes a deletion at the highest version its events carry.
func (r *Relay) updates(ctx context.Context, tx pgx.Tx, events []outbox.Event) ([]keystate.Ref, []keystate.Key, error) {
	highest := make(map[keystate.Ref]int64, len(events))
	refs := make([]keystate.Ref, 0, len(events))
	for _, e := range events {
		v, seen := highest[e.Ref()]
		if !seen {
			refs = append(refs, e.Ref())
		}
		highest[e.Ref()] = max(v, e.Version)
	}
	current, err := r.store.CurrentKeys(ctx, tx, refs, r.cfg.MaxCachedBody)
	if err != nil {
		return nil, nil, err
	}
	updates := make([]keystate.Key, len(refs))
	for i, ref := range refs {
		if k, ok := current[ref]; ok {
			updates[i] = k
		} else {
			updates[i] = keystate.Gone(ref, highest[ref])
		}
	}
	return refs, updates, nil
}

// failedEvents returns the events whose key's update Redis refused, and
// logs each.
func (r *Relay) failedEvents(events []outbox.Event, refs []keystate.Ref, results []cache.ApplyResult) []outbox.FailedEvent {
	refused := map[keystate.Ref]error{}
	for i, res := range results {
		if res.Err != nil {
			refused[refs[i]] = res.Err
		}
	}
	if len(refused) == 0 {
		return nil
	}
	var failed []outbox.FailedEvent
	for _, e := range events {
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
	refused := make(map[int64]bool, len(failed))
	for _, f := range failed {
		refused[f.ID] = true
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
	for {
		err := r.listenOnce(ctx, retry.Reset)
		if ctx.Err() != nil {
			return
		}
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

// countInterval is how often the pending and parked gauges are refreshed.
const countInterval = 5 * time.Second

// countEvents refreshes the pending and parked gauges until ctx ends.
func (r *Relay) countEvents(ctx context.Context) {
	t := time.NewTicker(countInterval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, countInterval)
		pending, parked, err := r.store.CountEvents(cctx, r.cfg.Pool)
		cancel()
		if err == nil {
			r.metrics.pendingEvents.Set(float64(pending))
			r.metrics.parkedEvents.Set(float64(parked))
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
