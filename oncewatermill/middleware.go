package oncewatermill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// DefaultKeyMetadata is the metadata field that carries a message's
// idempotency key unless Options says otherwise. It is snake_case, as
// Watermill's own metadata fields are (correlation_id, reason_poisoned),
// and every Watermill marshaler carries it as it is: an AMQP or Kafka
// header, a NATS header, a column of the SQL pub/sub's metadata.
const DefaultKeyMetadata = "idempotency_key"

// Options configures the middleware. The zero value takes the key from
// the idempotency_key metadata field, the scope from the handler's name
// and the payload from the message's payload.
type Options struct {
	// KeyMetadata names the metadata field that holds the key (default
	// DefaultKeyMetadata). A message without it is dead-lettered as
	// invalid. The publisher sets it once per logical message and keeps
	// it across its own retries.
	KeyMetadata string
	// Key, when set, derives the key instead: from other metadata, from
	// the payload (onceonly.KeyFromJSON), or UUIDKey, the fallback for
	// publishers that set no key (see UUIDKey for what it costs).
	Key func(msg *message.Message) (string, error)
	// Scope is the scope of every message's key: the tenant, or the
	// message type, whose keys must never meet another's. ScopeOf, when
	// set, takes it from each message instead (Metadata("tenant_id")).
	// With neither, the scope is the name of the router handler the
	// message runs in, so two handlers consuming one message each run
	// once, and a handler name must then hold no ':'.
	Scope   string
	ScopeOf func(msg *message.Message) (string, error)
	// Payload returns what the key's first execution is compared with
	// (its fingerprint); default the message's payload. The same key with
	// another payload is dead-lettered (onceonly.ReasonReused), not run:
	// leave out of it what differs between two sends of one message.
	//
	// Key, ScopeOf and Payload must depend on the message alone: an error
	// or a panic in any of them dead-letters the message as invalid, and
	// no key row is written.
	Payload func(msg *message.Message) ([]byte, error)
	// Policy turns the engine's answers into acks, delayed redeliveries
	// and dead letters (MaxFailures, MinBackoff, MaxBackoff).
	Policy onceonly.SettlePolicy
	// NoJoin runs every message in a transaction of the engine's own
	// (Engine.Do), even when the subscriber hands the handler a
	// transaction of its own (watermill-sql). The handler must then write
	// through onceonly.Tx(msg.Context()) only: writes through the
	// subscriber's transaction would commit apart from the key.
	NoJoin bool
	// Settled, when set, is called once a message is settled: its
	// produced messages returned (Ack), nacked after s.After (Retry), or
	// returned as a DeadLetterError for the poison queue (DeadLetter). It
	// runs on the handler's goroutine, so it must return quickly.
	Settled func(msg *message.Message, s onceonly.Settlement)
	// Stop, when set, is called once, on a goroutine of its own, when the
	// engine cannot run any message: its schema is missing or behind
	// (onceonly.ErrSchemaBehind: run migrations.Up) or it was not made by
	// onceonly.New (onceonly.ErrNotMade). Stop the router there
	// (func(error) { _ = router.Close() }). Either way such a message is
	// nacked, never dead-lettered (after SettlePolicy.MinBackoff, or
	// MaxBackoff without Stop), and the error is logged.
	Stop func(err error)
	// Logger receives the middleware's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the middleware's Prometheus metrics; nil keeps
	// them unregistered. Several middlewares may share one.
	Registerer prometheus.Registerer
}

// Metadata returns an Options.Key or Options.ScopeOf that reads the
// metadata field name; a message without it, or with it empty, is
// invalid.
func Metadata(name string) func(msg *message.Message) (string, error) {
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(name)
		if v == "" {
			return "", fmt.Errorf("no %s metadata", name)
		}
		return v, nil
	}
}

// UUIDKey is the fallback Options.Key: the message's UUID. Use it only
// when publishers set no key of their own and never send a logical
// message twice under two UUIDs. Many do: watermill.NewUUID runs in
// message.NewMessage, so a publisher that retries by building the message
// again, a forwarder or an outbox relay that wraps it, or a service that
// publishes it again after a crash sends a new UUID, and the copy runs
// again. A UUID also says nothing of who sent it: keep Scope (or ScopeOf)
// per tenant when tenants publish.
func UUIDKey(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", errors.New("no UUID")
	}
	return msg.UUID, nil
}

// NewMiddleware returns router middleware (message.HandlerMiddleware)
// that runs the handler it wraps once per (scope, key) with engine, and
// settles each message from the engine's answer: see the package comment.
// Add it to one handler (Handler.AddMiddleware) or to the router, after
// a poison queue that takes DeadLetterErrors (IsDeadLetter).
func NewMiddleware(engine *onceonly.Engine, opts Options) (message.HandlerMiddleware, error) {
	if engine == nil {
		return nil, errors.New("oncewatermill: an Engine is required")
	}
	if opts.KeyMetadata == "" {
		opts.KeyMetadata = DefaultKeyMetadata
	}
	if opts.Key == nil {
		opts.Key = Metadata(opts.KeyMetadata)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ider := identifier(opts)
	if err := ider.CheckScope(); err != nil {
		// Every message would be dead-lettered as invalid.
		return nil, fmt.Errorf("oncewatermill: %w", err)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("oncewatermill: %w", err)
	}
	mw := &middleware{engine: engine, opts: opts, identifier: ider, log: opts.Logger, metrics: m, failures: newFailureCounts(maxCounted)}
	return mw.wrap, nil
}

// middleware is the state NewMiddleware's HandlerMiddleware shares
// between the handlers it wraps.
type middleware struct {
	engine     *onceonly.Engine
	opts       Options
	identifier consume.Identifier[*message.Message]
	log        *slog.Logger
	metrics    *metrics
	// failures counts the failed executions the engine does not count
	// (joined transactions): see settlementOf.
	failures *failureCounts
	stopOnce sync.Once // of Options.Stop
}

// wrap is the HandlerMiddleware.
func (m *middleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(msg, h)
	}
}

// handle runs msg once through the engine and settles it.
func (m *middleware) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	id, err := m.identify(msg)
	if err != nil {
		return m.settle(msg, id, m.opts.Policy.Settle(onceonly.Outcome{}, err), nil)
	}
	run := &execution{msg: msg, next: h}
	out, err := m.execute(msg, id, run)
	s := m.settlementOf(id, run, out, err)
	if fatal := consume.Fatal(s); fatal != nil {
		return m.stop(msg, id, s, fatal)
	}
	return m.settle(msg, id, s, run)
}

// stop answers a message the engine cannot run, nor any other (see
// consume.Fatal): Options.Stop stops the router, and the message is nacked
// (after SettlePolicy.MinBackoff when Stop is set, else after MaxBackoff),
// never dead-lettered.
func (m *middleware) stop(msg *message.Message, id consume.Identity, s onceonly.Settlement, err error) ([]*message.Message, error) {
	m.metrics.messages.WithLabelValues(message.HandlerNameFromCtx(msg.Context()), s.Disposition.String(), consume.ReasonStopped).Inc()
	m.log.Error("oncewatermill: the engine cannot run any message; nacking it", "message_uuid", msg.UUID, "scope", id.Scope, "key", id.Key, "error", err)
	delay := m.opts.Policy.Backoff(math.MaxInt32)
	if m.opts.Stop != nil {
		m.stopOnce.Do(func() { go m.opts.Stop(err) })
		delay = m.opts.Policy.Backoff(1) // not at once: some pub/subs deliver it again at once
	}
	wait(msg.Context(), delay)
	msg.Nack()
	if m.opts.Settled != nil {
		m.opts.Settled(msg, s)
	}
	return nil, nil
}

// identify returns the scope, key and payload of msg; an error wraps
// onceonly.ErrInvalidMessage (or another error Settle reads as invalid).
// A panic in Options.Key, ScopeOf or Payload is such an error too: they
// depend on the message alone, so it would panic again on every
// redelivery.
func (m *middleware) identify(msg *message.Message) (consume.Identity, error) {
	id, err := m.identifier.Identify(msg)
	if p, ok := errors.AsType[*consume.PanicError](err); ok {
		m.log.Error("oncewatermill: Options.Key, ScopeOf or Payload panicked", "message_uuid", msg.UUID, "panic", p.Value)
	}
	return id, err
}

// identifier takes a message's identity as opts say: Key; Scope, ScopeOf,
// or else the router handler's name; Payload or the message's payload.
func identifier(opts Options) consume.Identifier[*message.Message] {
	ider := consume.Identifier[*message.Message]{
		Scope:   opts.Scope,
		ScopeOf: opts.ScopeOf,
		Key:     opts.Key,
		Payload: opts.Payload,
		Body:    func(msg *message.Message) []byte { return msg.Payload },
	}
	if ider.ScopeOf == nil && ider.Scope == "" {
		ider.ScopeOf = func(msg *message.Message) (string, error) {
			if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
				return name, nil
			}
			return "", errors.New("no Options.Scope and no router handler name")
		}
	}
	return ider
}

// execute runs msg's handler once for id: in the subscriber's transaction
// when it hands one over (joined), else in the engine's own.
func (m *middleware) execute(msg *message.Message, id consume.Identity, run *execution) (onceonly.Outcome, error) {
	ctx := msg.Context()
	if !m.opts.NoJoin {
		tx, err := subscriberTx(ctx)
		if err != nil {
			return onceonly.Outcome{}, err
		}
		switch {
		case tx.pgx != nil:
			run.joined = true
			return m.engine.DoTx(ctx, tx.pgx, id.Scope, id.Key, id.Payload, run.pgxHandler)
		case tx.sql != nil:
			run.joined = true
			return m.engine.DoSQLTx(ctx, tx.sql, id.Scope, id.Key, id.Payload, run.sqlHandler)
		}
	}
	return m.engine.Do(ctx, id.Scope, id.Key, id.Payload, run.pgxHandler)
}

// settlementOf settles the engine's answer. A failed execution the engine
// could not count (in a joined transaction its claim is rolled back with
// it, so no row records the failure; and an engine that does not count)
// is counted here, in memory, so that SettlePolicy.MaxFailures bounds it
// in this process too. A settled key's count is forgotten.
func (m *middleware) settlementOf(id consume.Identity, run *execution, out onceonly.Outcome, err error) onceonly.Settlement {
	if run.err != nil && err != nil {
		failed, ok := errors.AsType[*onceonly.ExecutionError](err)
		if !ok || (!failed.HandedOff && failed.Failures == 0) {
			err = &onceonly.ExecutionError{Err: err, Failures: m.failures.add(id.Scope, id.Key)}
		}
	}
	s := m.opts.Policy.Settle(out, err)
	if run.joined && run.err == nil && s.Disposition == onceonly.Retry && serializationFailure(err) {
		// watermill-sql's transactions are REPEATABLE READ: a key whose
		// row changed after the subscriber's snapshot (another execution
		// claimed it, renews its lease, finished it) cannot be claimed
		// in it (the engine's statement failed, not the handler's). That is a copy in flight elsewhere, not a failure: it
		// comes again as one does, and is replayed from Redis once the
		// holder finishes, or from Postgres in the subscriber's next
		// transaction.
		s.After = onceonly.MaxInFlightRetry
	}
	if s.Disposition != onceonly.Retry {
		m.failures.forget(id.Scope, id.Key)
	}
	return s
}

// settle returns what the router makes of msg for s: its produced
// messages (ack), nothing after a Nack sent once s.After passed (retry),
// or a DeadLetterError for the poison queue.
func (m *middleware) settle(msg *message.Message, id consume.Identity, s onceonly.Settlement, run *execution) ([]*message.Message, error) {
	var produced []*message.Message
	if s.Disposition == onceonly.Ack {
		var err error
		if produced, err = run.produced(s.Outcome); err != nil {
			s = onceonly.Settlement{Disposition: onceonly.DeadLetter, Reason: onceonly.ReasonInvalid, Err: err}
		}
	}
	reason := reasonOf(s)
	m.metrics.messages.WithLabelValues(message.HandlerNameFromCtx(msg.Context()), s.Disposition.String(), reason).Inc()
	log := m.log.With("message_uuid", msg.UUID, "scope", id.Scope, "key", id.Key)
	var err error
	switch s.Disposition {
	case onceonly.Ack:
	case onceonly.DeadLetter:
		log.Warn("oncewatermill: dead-lettering the message", "reason", s.Reason, "failures", s.Failures, "error", s.Err)
		msg.Metadata.Set(ReasonMetadata, s.Reason)
		err = &DeadLetterError{Reason: s.Reason, Err: s.Err}
	case onceonly.Retry:
		level := slog.LevelInfo
		if reason == consume.ReasonInFlight || reason == reasonConflict {
			level = slog.LevelDebug // a copy of a message under way: routine
		}
		log.Log(msg.Context(), level, "oncewatermill: nacking the message after a delay", "why", reason, "after", s.After, "failures", s.Failures, "error", s.Err)
		m.metrics.waiting.Inc()
		wait(msg.Context(), s.After)
		m.metrics.waiting.Dec()
		// Nacked here, not by returning an error: no middleware outside
		// (a PoisonQueue without a filter, Retry) takes a delivery that
		// only has to come again for a failure of its own.
		msg.Nack()
	}
	if m.opts.Settled != nil {
		m.opts.Settled(msg, s)
	}
	return produced, err
}

// wait returns after d, or when ctx ends.
func wait(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
