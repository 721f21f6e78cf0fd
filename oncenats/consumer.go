package oncenats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
	"github.com/onceonly/onceonly/startstop"
)

// Message is one logical message as a handler sees it.
type Message struct {
	// Scope and Key identify the message (Options.Scope or ScopeOf,
	// Options.Key).
	Scope, Key string
	// Payload is the message's content as the key's first execution
	// recorded it (Options.Payload; the data by default).
	Payload []byte
	// Msg is the JetStream message being handled; nil when Engine.Resume
	// finishes the message after the process running it died.
	Msg jetstream.Msg
}

// Handler is the work of a message that may call systems outside Postgres:
// each external call runs through onceonly.Step (with the downstream key it
// is given), then the business writes go through onceonly.Tx(ctx), which
// commits together with the key's completion. Returning nil acks the
// message after that commit; an error fails the key (or hands it off when
// a step's outcome is unknown) and the message comes again (see the
// package comment). Wrap onceonly.ErrInvalidMessage to dead-letter the
// message as invalid at once.
//
// A Handler must depend on msg.Scope, msg.Key and msg.Payload alone: when
// its process dies after a step started, a live engine's Resume runs it
// again from the stored payload, with no JetStream message (msg.Msg nil).
type Handler func(ctx context.Context, msg Message) error

// TxHandler is the work of a message that only writes to Postgres: its
// writes go through tx, which commits together with the key's completion.
// It cannot call onceonly.Step (the transaction is open); use Handler for
// external calls. Errors as for Handler.
type TxHandler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Defaults of Options.
const (
	// DefaultKeyHeader is the header Options.Key reads by default.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultWorkers is Options.Workers when unset.
	DefaultWorkers = 4
	// DefaultShutdownTimeout is Options.ShutdownTimeout when unset.
	DefaultShutdownTimeout = 8 * time.Second
	// DefaultAckTimeout is Options.AckTimeout when unset.
	DefaultAckTimeout = 5 * time.Second
	// DefaultBatchSize is Options.BatchSize when unset (measured in
	// docs/BENCHMARKS.md).
	DefaultBatchSize = consume.DefaultBatchSize
	// DefaultBatchLinger is Options.BatchLinger when unset.
	DefaultBatchLinger = consume.DefaultBatchLinger
	// DefaultRetryMin and DefaultRetryMax bound the backoff between
	// attempts to find the consumer and subscribe again.
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
)

// The headers a dead letter carries besides the original message's.
const (
	// HeaderReason names why the message was dead-lettered: one of
	// onceonly.ReasonReused, ReasonInvalid, ReasonFailed.
	HeaderReason = "Onceonly-Reason"
	// HeaderError is the error that dead-lettered it, for people.
	HeaderError = "Onceonly-Error"
	// HeaderSubject is the subject the message was published on.
	HeaderSubject = "Onceonly-Subject"
)

// Options configures a Consumer. JetStream, Stream, Consumer, and Scope or
// ScopeOf are required.
type Options struct {
	// JetStream is the JetStream context of the connection consumed on.
	// nats.go reconnects it by itself; connect with nats.MaxReconnects(-1)
	// so it never gives up (a closed connection ends Run with an error).
	JetStream jetstream.JetStream
	// Stream and Consumer name the durable pull consumer the messages come
	// from. It must ack explicitly; give it no MaxDeliver limit (see the
	// package comment).
	Stream, Consumer string
	// Declare, when set, returns the consumer instead of looking it up,
	// each time consuming starts (at Start, and after the consumer was
	// lost): Topology.Declare, which creates the stream and the consumer
	// when they are missing. An error is retried with backoff.
	Declare func(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error)

	// Scope is the scope of every message's key (the tenant, or the
	// message type). ScopeOf, when set, takes it from each message instead
	// (a header, a subject token, a field of the data).
	Scope   string
	ScopeOf func(msg jetstream.Msg) (string, error)
	// Key returns a message's idempotency key; default
	// HeaderKey(DefaultKeyHeader). It must name the logical message, as
	// its producer made it once; not Nats-Msg-Id alone (see the package
	// comment), never a sequence number.
	Key func(msg jetstream.Msg) (string, error)
	// Payload returns what the key's first execution is compared with and
	// what the handler gets as Message.Payload; default the data. A
	// payload that differs for two copies of one message (a timestamp the
	// publisher set on each send) makes the second a reused key.
	//
	// ScopeOf, Key and Payload must be pure functions of the message: an
	// error from any of them dead-letters the message as invalid
	// (onceonly.ReasonInvalid), and no key row is written.
	Payload func(msg jetstream.Msg) ([]byte, error)
	// DeadLetterSubject is where a copy of a dead-lettered message is
	// published before the message is terminated; a stream must take it
	// (Topology.DeadLetterSubject). Empty: the message is terminated
	// without a copy, its reason only logged and counted.
	DeadLetterSubject string

	// Name is the name NewConsumer registers the Handler under with the
	// engine, the same in every process consuming these messages (default
	// "nats." + Stream + "." + Consumer).
	Name string
	// Workers is how many messages are handled at once (default
	// DefaultWorkers).
	Workers int
	// Prefetch is how many messages are asked of the server ahead of the
	// workers (default Workers × BatchSize). One waiting for a worker is
	// not kept in progress: its AckWait runs.
	Prefetch int
	// BatchSize is how many messages a worker runs in one transaction
	// (onceonly.Engine.DoBatch): a worker's batch closes at BatchSize
	// messages or BatchLinger after its first, whichever comes first, and
	// its messages are acked after the batch's commit. Default
	// DefaultBatchSize; 1 runs each message alone, in a transaction of its
	// own. At most onceonly.MaxBatch. A Handler that calls onceonly.Step
	// inside a batch is refused (onceonly.ErrStepInBatch) and its message
	// runs again alone, so a consumer whose every message steps is better
	// off with 1.
	BatchSize int
	// BatchLinger is how long a batch waits for more messages after its
	// first at most (default DefaultBatchLinger), and a tenth of it how
	// long it waits for the next (consume.Collect): a bound on the
	// latency batching adds at low rates.
	BatchLinger time.Duration
	// Policy turns the engine's answers into acks, delayed redeliveries
	// and dead letters (MaxFailures, MinBackoff, MaxBackoff).
	Policy onceonly.SettlePolicy
	// LeaseTimeout is the engine's Config.LeaseTimeout when not the
	// default: a message whose execution runs is kept (InProgress) every
	// third of the shorter of it and the consumer's AckWait.
	LeaseTimeout time.Duration
	// ShutdownTimeout bounds how long Stop waits for the executions under
	// way before canceling their contexts (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// AckTimeout bounds the wait for the server to confirm an ack or a
	// dead letter's publication (default DefaultAckTimeout).
	AckTimeout time.Duration
	// Settled, when set, is called after each message is settled: acked,
	// dead-lettered, or given back for a later delivery (s.Disposition
	// Retry, s.After); not for the messages Stop hands back unstarted. A
	// batch's messages are reported in the batch's order once all of them
	// are settled. It runs on the worker that handled the message, so it
	// must return quickly. Audit trails and tests use it, as River's Client.Subscribe.
	Settled func(msg jetstream.Msg, s onceonly.Settlement)
	// Logger receives the consumer's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the consumer's Prometheus metrics; nil keeps
	// them unregistered. Consumers of several streams may share one.
	Registerer prometheus.Registerer
}

// Consumer consumes one JetStream pull consumer, running each logical
// message once through an onceonly.Engine. Create it with NewConsumer or
// NewTxConsumer; it is safe for concurrent use.
type Consumer struct {
	life      startstop.Base
	engine    *onceonly.Engine
	opts      Options
	exec      *consume.Executor[jetstream.Msg]
	log       *slog.Logger
	metrics   *metrics
	consuming atomic.Bool
	mu        sync.Mutex
	ended     error // why the loop ended by itself
}

// NewConsumer returns a consumer running fn, and registers fn with engine
// under opts.Name so that engine.Resume can finish an execution whose
// process died after a step started. Every process consuming these
// messages must create the consumer (which registers it) and run
// engine.Resume.
func NewConsumer(engine *onceonly.Engine, fn Handler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncenats: a Handler is required")
	}
	return newConsumer(engine, opts, consume.Work[jetstream.Msg]{Handler: func(ctx context.Context, id consume.Identity, msg jetstream.Msg) error {
		return fn(ctx, message(id, msg))
	}})
}

// NewTxConsumer returns a consumer running fn, a handler that only writes
// to Postgres (through Engine.Do).
func NewTxConsumer(engine *onceonly.Engine, fn TxHandler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncenats: a TxHandler is required")
	}
	return newConsumer(engine, opts, consume.Work[jetstream.Msg]{Tx: func(ctx context.Context, tx pgx.Tx, id consume.Identity, msg jetstream.Msg) error {
		return fn(ctx, tx, message(id, msg))
	}})
}

// newConsumer checks opts, fills in their defaults and returns a consumer
// running w.
func newConsumer(engine *onceonly.Engine, opts Options, w consume.Work[jetstream.Msg]) (*Consumer, error) {
	switch {
	case engine == nil:
		return nil, errors.New("oncenats: an Engine is required")
	case opts.JetStream == nil:
		return nil, errors.New("oncenats: Options.JetStream is required")
	case opts.Stream == "" || opts.Consumer == "":
		return nil, errors.New("oncenats: Options.Stream and Options.Consumer are required")
	case opts.Scope == "" && opts.ScopeOf == nil:
		return nil, errors.New("oncenats: Options.Scope or Options.ScopeOf is required")
	case opts.Workers < 0, opts.Prefetch < 0, opts.LeaseTimeout < 0, opts.ShutdownTimeout < 0, opts.AckTimeout < 0,
		opts.BatchSize < 0, opts.BatchLinger < 0:
		return nil, errors.New("oncenats: Options.Workers, Prefetch, LeaseTimeout, ShutdownTimeout, AckTimeout, BatchSize and BatchLinger must not be negative")
	case opts.BatchSize > onceonly.MaxBatch:
		return nil, fmt.Errorf("oncenats: Options.BatchSize is at most onceonly.MaxBatch (%d)", onceonly.MaxBatch)
	}
	if opts.Name == "" {
		opts.Name = "nats." + opts.Stream + "." + opts.Consumer
	}
	if opts.Key == nil {
		opts.Key = HeaderKey(DefaultKeyHeader)
	}
	if err := identifier(opts).CheckScope(); err != nil {
		// Caught here, or every message would be dead-lettered as invalid.
		return nil, fmt.Errorf("oncenats: %w", err)
	}
	if opts.Workers == 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.BatchLinger == 0 {
		opts.BatchLinger = DefaultBatchLinger
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = opts.Workers * opts.BatchSize
	}
	if opts.LeaseTimeout == 0 {
		opts.LeaseTimeout = onceonly.DefaultLeaseTimeout
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m, err := newMetrics(opts.Registerer, opts.Stream, opts.Consumer)
	if err != nil {
		return nil, fmt.Errorf("oncenats: %w", err)
	}
	c := &Consumer{
		engine:  engine,
		opts:    opts,
		log:     opts.Logger.With("stream", opts.Stream, "consumer", opts.Consumer),
		metrics: m,
	}
	if c.exec, err = consume.New(c.config(), opts.Name, w); err != nil {
		return nil, err
	}
	return c, nil
}

// Run consumes until ctx ends or Stop is called and returns nil after a
// graceful stop (see Stop). It survives server restarts and lost
// connections (nats.go reconnects; the pull requests are sent again) and a
// consumer that is gone for a while (it is looked up, or declared, again
// with backoff). It returns an error when it cannot go on: the connection
// was closed for good, the consumer does not ack explicitly, or the engine
// cannot run any message (its schema is missing or behind,
// onceonly.ErrSchemaBehind: run migrations.Up; or it was not made by
// onceonly.New), which hands the message back and dead-letters none.
func (c *Consumer) Run(ctx context.Context) error {
	if err := startstop.Run(ctx, c); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// Start starts consuming in the background, as Run does, and returns at
// once; consuming ends when ctx ends or at Stop. Starting a running
// consumer does nothing.
func (c *Consumer) Start(ctx context.Context) error {
	ctx, ok, started, stopped := c.life.StartInit(ctx)
	if !ok {
		return nil
	}
	c.mu.Lock()
	c.ended = nil
	c.mu.Unlock()
	go func() {
		defer stopped()
		started()
		err := c.loop(ctx)
		if fatal := consume.Cause(ctx); fatal != nil {
			err = fatal
		}
		if err != nil {
			c.log.ErrorContext(ctx, "oncenats: stopped consuming", "err", err)
			c.mu.Lock()
			c.ended = err
			c.mu.Unlock()
			return
		}
		c.log.InfoContext(ctx, "oncenats: stopped consuming")
	}()
	return nil
}

// Stop stops asking for messages, lets the executions under way finish
// and settle for up to ShutdownTimeout (then cancels their contexts), and
// hands the messages it holds unstarted back to the server (Nak), which
// delivers them again at once; a message it could not settle comes back
// after the consumer's AckWait. It is safe to call twice, or without
// Start.
func (c *Consumer) Stop() { c.life.Stop() }

// Started returns a channel closed once the consumer has started.
func (c *Consumer) Started() <-chan struct{} { return c.life.Started() }

// Stopped returns a channel closed once the consumer started last has
// stopped (closed already when it is not running).
func (c *Consumer) Stopped() <-chan struct{} { return c.life.Stopped() }

// Connected reports whether the consumer is subscribed on a live
// connection now (a readiness check).
func (c *Consumer) Connected() bool {
	return c.consuming.Load() && c.opts.JetStream.Conn().IsConnected()
}

// errMisconfigured marks an error that retrying cannot mend.
var errMisconfigured = errors.New("oncenats: misconfigured")

// loop finds the consumer and consumes it, again and again, until ctx
// ends (nil) or it cannot go on.
func (c *Consumer) loop(ctx context.Context) error {
	wait := DefaultRetryMin
	for {
		cons, err := c.find(ctx)
		if err == nil {
			err = c.consume(ctx, cons)
		}
		select {
		case <-ctx.Done():
			return nil // a stop: what ended consuming is no error
		default:
		}
		switch {
		case errors.Is(err, errMisconfigured):
			return err
		case c.opts.JetStream.Conn().IsClosed():
			return fmt.Errorf("oncenats: the NATS connection is closed: %w", err)
		}
		c.metrics.settleErrors.WithLabelValues(opConsume).Inc()
		c.log.WarnContext(ctx, "oncenats: consuming failed; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, DefaultRetryMax)
	}
}

// find returns the consumer (Declare, or a look-up) after checking it
// acks explicitly.
func (c *Consumer) find(ctx context.Context) (jetstream.Consumer, error) {
	var (
		cons jetstream.Consumer
		err  error
	)
	if c.opts.Declare != nil {
		cons, err = c.opts.Declare(ctx, c.opts.JetStream)
	} else {
		cons, err = c.opts.JetStream.Consumer(ctx, c.opts.Stream, c.opts.Consumer)
	}
	if err != nil {
		return nil, fmt.Errorf("find consumer %s on stream %s: %w", c.opts.Consumer, c.opts.Stream, err)
	}
	info := cons.CachedInfo()
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %s on stream %s acks %s: it must ack explicitly", errMisconfigured, info.Name, info.Stream, info.Config.AckPolicy)
	}
	if info.Config.MaxDeliver > 0 {
		c.log.WarnContext(ctx, "oncenats: the consumer has a MaxDeliver limit: every redelivery counts, those of a key in flight elsewhere too, and a message past it is dropped without a dead letter", "max_deliver", info.Config.MaxDeliver)
	}
	return cons, nil
}

// consume reads messages through one pull subscription (Consume) and
// hands them to the workers, until ctx ends (nil) or the subscription ends
// by itself (its error).
func (c *Consumer) consume(ctx context.Context, cons jetstream.Consumer) error {
	progress := progressInterval(cons.CachedInfo().Config.AckWait, c.opts.LeaseTimeout)
	// Executions run on a context of their own: the end of ctx stops the
	// intake, and only the shutdown bound cancels what is under way.
	execCtx, cancelExecutions := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelExecutions()
	var (
		work     = make(chan jetstream.Msg)
		stopping = make(chan struct{}) // closed once the intake stops
		end      endSignal
	)
	// The callback runs on the subscription's goroutine, one message at a
	// time, and waits for a free worker: the server is asked for more only
	// as workers free up.
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case <-stopping:
		default:
			select {
			case work <- msg:
				return
			case <-stopping:
			}
		}
		c.handBack(execCtx, msg)
	},
		jetstream.PullMaxMessages(c.opts.Prefetch),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// A missing heartbeat or a reconnect: the subscription sends
			// its pull requests again by itself. The rest ends it.
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) ||
				errors.Is(err, jetstream.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				end.set(err)
				return
			}
			c.log.DebugContext(ctx, "oncenats: pull subscription", "err", err)
		}),
	)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	closed := cc.Closed()
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	var workers sync.WaitGroup
	for range c.opts.Workers {
		workers.Go(func() {
			for {
				select {
				case msg := <-work:
					if c.opts.BatchSize == 1 {
						c.handle(execCtx, msg, progress)
						continue
					}
					c.handleBatch(execCtx, consume.Collect(msg, work, c.opts.BatchSize, c.opts.BatchLinger, stopping), progress)
				case <-stopping:
					return
				}
			}
		})
	}
	idle := make(chan struct{})
	go func() { workers.Wait(); close(idle) }()

	select {
	case <-ctx.Done():
	case <-end.done():
	case <-closed:
	}
	close(stopping)
	if ctx.Err() == nil {
		// Ended by itself: the executions under way finish as usual,
		// unless ctx ends meanwhile.
		cc.Stop()
		select {
		case <-idle:
			return end.err()
		case <-ctx.Done():
		}
	} else {
		cc.Drain() // the messages already here come out, to be handed back
	}
	c.awaitShutdown(ctx, idle, closed, cancelExecutions)
	return end.err()
}

// awaitShutdown waits for the workers to finish their messages and for
// the subscription to hand back what it held, at most ShutdownTimeout;
// past it, it cancels the executions and waits for the workers.
func (c *Consumer) awaitShutdown(ctx context.Context, idle, closed <-chan struct{}, cancelExecutions context.CancelFunc) {
	bound := time.NewTimer(c.opts.ShutdownTimeout)
	defer bound.Stop()
	for idle != nil || closed != nil {
		select {
		case <-idle:
			idle = nil
		case <-closed:
			closed = nil
		case <-bound.C:
			if idle != nil {
				c.log.WarnContext(ctx, "oncenats: executions still running at the shutdown bound: canceling them", "shutdown_timeout", c.opts.ShutdownTimeout)
				cancelExecutions()
				<-idle
			}
			return
		}
	}
}

// handBack returns a message that arrived while the consumer stops,
// unstarted: the server delivers it again at once, to another consumer or
// this one's successor.
func (c *Consumer) handBack(ctx context.Context, msg jetstream.Msg) {
	c.metrics.messages.WithLabelValues(onceonly.Retry.String(), reasonShutdown).Inc()
	if err := msg.Nak(); err != nil {
		c.settleError(ctx, opNak, msg, err)
	}
}

// progressInterval is how often a message whose execution runs is marked
// in progress: a third of the shorter of the consumer's AckWait and the
// engine's lease, the cadence at which the engine renews the lease. The
// message is then kept exactly as long as its execution keeps the key: a
// live one is never delivered again meanwhile, and once its process is
// gone the message comes back about when the lease runs out and a
// takeover can finish the key.
func progressInterval(ackWait, lease time.Duration) time.Duration {
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	return max(min(ackWait, lease)/3, 10*time.Millisecond)
}

// endSignal records the error that ended a subscription.
type endSignal struct {
	once sync.Once
	mu   sync.Mutex
	ch   chan struct{}
	e    error
}

func (s *endSignal) init() { s.once.Do(func() { s.ch = make(chan struct{}) }) }

func (s *endSignal) set(err error) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e == nil {
		s.e = err
		close(s.ch)
	}
}

func (s *endSignal) done() <-chan struct{} {
	s.init()
	return s.ch
}

func (s *endSignal) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e == nil {
		return errors.New("the pull subscription ended")
	}
	return s.e
}
