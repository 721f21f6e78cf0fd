package onceamqp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
	"github.com/onceonly/onceonly/startstop"
)

// Message is one logical message as a handler sees it.
type Message struct {
	// Scope and Key identify the message (Options.Scope, Options.Key).
	Scope, Key string
	// Payload is the message's content as the key's first execution
	// recorded it (Options.Payload; the body by default).
	Payload []byte
	// Delivery is the delivery being handled; nil when Engine.Resume
	// finishes the message after the process running it died.
	Delivery *amqp.Delivery
}

// Handler is the work of a message that may call systems outside Postgres:
// each external call runs through onceonly.Step (with the downstream key it
// is given), then the business writes go through onceonly.Tx(ctx), which
// commits together with the key's completion. Returning nil acks the
// delivery after that commit; an error fails the key (or hands it off when
// a step's outcome is unknown) and the delivery comes again (see the
// package comment); so does a panic, which is recovered. Wrap
// onceonly.ErrInvalidMessage to dead-letter the message as invalid at
// once.
//
// A Handler must depend on msg.Scope, msg.Key and msg.Payload alone: when
// its process dies after a step started, a live engine's Resume runs it
// again from the stored payload, with no delivery (msg.Delivery nil).
type Handler func(ctx context.Context, msg Message) error

// TxHandler is the work of a message that only writes to Postgres: its
// writes go through tx, which commits together with the key's completion.
// It cannot call onceonly.Step (the transaction is open); use Handler for
// external calls. Errors as for Handler.
type TxHandler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Defaults of Options.
const (
	DefaultWorkers         = 4
	DefaultShutdownTimeout = 8 * time.Second
	DefaultReconnectMin    = 100 * time.Millisecond
	DefaultReconnectMax    = 5 * time.Second
	// DefaultDialTimeout bounds a dial and the AMQP handshake when
	// Options.AMQP.Dial is unset.
	DefaultDialTimeout = 10 * time.Second
	// DefaultBatchSize is Options.BatchSize when unset (measured in
	// docs/BENCHMARKS.md).
	DefaultBatchSize = consume.DefaultBatchSize
	// DefaultBatchLinger is Options.BatchLinger when unset.
	DefaultBatchLinger = consume.DefaultBatchLinger
)

// Options configures a Consumer. URL, Queue, and Scope or ScopeOf are
// required.
type Options struct {
	// URL is the broker's amqp:// (or amqps://) URL, virtual host
	// included.
	URL string
	// AMQP configures the connection: TLS, heartbeat, client properties.
	// Its connection_name property defaults to "onceamqp <Queue>".
	AMQP amqp.Config
	// Queue is the queue consumed.
	Queue string
	// Declare, when set, runs on every new connection before consuming
	// starts: declare the topology there (DeclareQueue), idempotently. An
	// error closes the connection and is retried as a failed connection.
	Declare func(conn *amqp.Connection) error

	// Scope is the scope of every message's key (the tenant, or the
	// message type). ScopeOf, when set, takes it from each delivery
	// instead.
	Scope   string
	ScopeOf func(d *amqp.Delivery) (string, error)
	// Key returns a delivery's idempotency key; default MessageID (the
	// message-id property). Never derive it from the delivery tag or
	// anything else a redelivery changes.
	Key func(d *amqp.Delivery) (string, error)
	// Payload returns what the key's first execution is compared with and
	// what the handler gets as Message.Payload; default the body. A payload
	// that differs for two deliveries of one message (a timestamp the
	// publisher set on each send) makes the second a reused key.
	//
	// ScopeOf, Key and Payload must be pure functions of the delivery: an
	// error from any of them dead-letters the delivery as invalid
	// (onceonly.ReasonInvalid), and no key row is written.
	Payload func(d *amqp.Delivery) ([]byte, error)

	// Name is the name NewConsumer registers the Handler under with the
	// engine, the same in every process consuming the queue (default
	// "amqp." + Queue).
	Name string
	// Workers is how many deliveries are handled at once (default
	// DefaultWorkers).
	Workers int
	// Prefetch is the channel's Qos prefetch count: deliveries sent ahead
	// of the workers, including those held for a retry (default 2 ×
	// Workers × BatchSize).
	Prefetch int
	// BatchSize is how many deliveries a worker runs in one transaction
	// (onceonly.Engine.DoBatch): a worker's batch closes at BatchSize
	// deliveries or BatchLinger after its first, whichever comes first,
	// and its deliveries are settled after the batch's commit. Default
	// DefaultBatchSize; 1 runs each delivery alone, in a transaction of
	// its own. At most onceonly.MaxBatch. A Handler that calls
	// onceonly.Step inside a batch is refused (onceonly.ErrStepInBatch)
	// and its delivery runs again alone, so a consumer whose every message
	// steps is better off with 1.
	BatchSize int
	// BatchLinger is how long a batch waits for more deliveries after its
	// first at most (default DefaultBatchLinger), and a tenth of it how
	// long it waits for the next (consume.Collect): a bound on the
	// latency batching adds at low rates.
	BatchLinger time.Duration
	// Policy turns the engine's answers into acks, retries and dead
	// letters (MaxFailures, MinBackoff, MaxBackoff).
	Policy onceonly.SettlePolicy
	// ShutdownTimeout bounds how long Stop waits for the executions under
	// way before canceling their contexts (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the jittered backoff between
	// attempts to reach the broker (defaults DefaultReconnectMin,
	// DefaultReconnectMax).
	ReconnectMin, ReconnectMax time.Duration
	// Settled, when set, is called after each delivery is settled: acked,
	// rejected to the dead-letter exchange, or held for a later requeue
	// (s.Disposition Retry, s.After). It runs on the worker that handled
	// the delivery, so it must return quickly. Audit trails and tests use
	// it, as River's Client.Subscribe.
	Settled func(d *amqp.Delivery, s onceonly.Settlement)
	// Logger receives the consumer's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the consumer's Prometheus metrics; nil keeps
	// them unregistered. Consumers of several queues may share one.
	Registerer prometheus.Registerer
}

// Consumer consumes one queue, running each logical message once through
// an onceonly.Engine. Create it with NewConsumer or NewTxConsumer; it is
// safe for concurrent use.
type Consumer struct {
	life      startstop.Base
	engine    *onceonly.Engine
	opts      Options
	exec      *consume.Executor[*amqp.Delivery]
	tag       string // consumer tag, the same on every connection
	log       *slog.Logger
	metrics   *metrics
	holds     *holds
	connected atomic.Bool

	mu    sync.Mutex
	ended error // the Fatal error the consumer started last stopped on
}

// NewConsumer returns a consumer running fn, and registers fn with engine
// under opts.Name so that engine.Resume can finish an execution whose
// process died after a step started. Every process consuming the queue
// must create the consumer (which registers it) and run the engine's
// resumer (Engine.Start runs it, or Engine.Resume).
func NewConsumer(engine *onceonly.Engine, fn Handler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("onceamqp: a Handler is required")
	}
	return newConsumer(engine, opts, consume.Work[*amqp.Delivery]{Handler: func(ctx context.Context, id consume.Identity, d *amqp.Delivery) error {
		return fn(ctx, message(id, d))
	}})
}

// NewTxConsumer returns a consumer running fn, a handler that only writes
// to Postgres (through Engine.Do).
func NewTxConsumer(engine *onceonly.Engine, fn TxHandler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("onceamqp: a TxHandler is required")
	}
	return newConsumer(engine, opts, consume.Work[*amqp.Delivery]{Tx: func(ctx context.Context, tx pgx.Tx, id consume.Identity, d *amqp.Delivery) error {
		return fn(ctx, tx, message(id, d))
	}})
}

// newConsumer checks opts, fills in their defaults and returns a consumer
// running w.
func newConsumer(engine *onceonly.Engine, opts Options, w consume.Work[*amqp.Delivery]) (*Consumer, error) {
	switch {
	case engine == nil:
		return nil, errors.New("onceamqp: an Engine is required")
	case opts.URL == "":
		return nil, errors.New("onceamqp: Options.URL is required")
	case opts.Queue == "":
		return nil, errors.New("onceamqp: Options.Queue is required")
	case opts.Scope == "" && opts.ScopeOf == nil:
		return nil, errors.New("onceamqp: Options.Scope or Options.ScopeOf is required")
	case opts.Workers < 0, opts.Prefetch < 0, opts.BatchSize < 0, opts.BatchLinger < 0:
		return nil, errors.New("onceamqp: Options.Workers, Prefetch, BatchSize and BatchLinger must not be negative")
	case opts.BatchSize > onceonly.MaxBatch:
		return nil, fmt.Errorf("onceamqp: Options.BatchSize is at most onceonly.MaxBatch (%d)", onceonly.MaxBatch)
	}
	if opts.Name == "" {
		opts.Name = "amqp." + opts.Queue
	}
	if opts.Key == nil {
		opts.Key = MessageID
	}
	if err := identifier(opts).CheckScope(); err != nil {
		// Every message would be dead-lettered as invalid.
		return nil, fmt.Errorf("onceamqp: %w", err)
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
		opts.Prefetch = 2 * opts.Workers * opts.BatchSize
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.ReconnectMin <= 0 {
		opts.ReconnectMin = DefaultReconnectMin
	}
	if opts.ReconnectMax <= 0 {
		opts.ReconnectMax = DefaultReconnectMax
	}
	opts.ReconnectMax = max(opts.ReconnectMax, opts.ReconnectMin)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// The caller's table is not ours to change.
	opts.AMQP.Properties = maps.Clone(opts.AMQP.Properties)
	if opts.AMQP.Properties == nil {
		opts.AMQP.Properties = amqp.NewConnectionProperties()
	}
	if _, ok := opts.AMQP.Properties["connection_name"]; !ok {
		opts.AMQP.Properties.SetClientConnectionName("onceamqp " + opts.Queue)
	}
	m, err := newMetrics(opts.Registerer, opts.Queue)
	if err != nil {
		return nil, fmt.Errorf("onceamqp: %w", err)
	}
	host, _ := os.Hostname()
	c := &Consumer{
		engine:  engine,
		opts:    opts,
		tag:     fmt.Sprintf("onceamqp.%s.%d.%s", host, os.Getpid(), rand.Text()[:8]),
		log:     opts.Logger.With("queue", opts.Queue),
		metrics: m,
		holds:   newHolds(m.held),
	}
	if c.exec, err = consume.New(c.config(), opts.Name, w); err != nil {
		return nil, err
	}
	return c, nil
}

// Run consumes until ctx ends or Stop is called, reconnecting whenever the
// broker is lost, and returns nil after a graceful stop (see Stop). It
// stops, and returns the error, when the engine cannot run any delivery:
// its schema is missing or behind (onceonly.ErrSchemaBehind: run
// migrations.Up), or it was not made by onceonly.New. The deliveries are
// left to the broker, which requeues them; none is dead-lettered.
func (c *Consumer) Run(ctx context.Context) error {
	if err := startstop.Run(ctx, c); err != nil {
		return err
	}
	return c.Err()
}

// Err returns the error the consumer started last stopped on (see Run),
// or nil.
func (c *Consumer) Err() error {
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
		c.consume(ctx, started)
		if err := consume.Cause(ctx); err != nil {
			c.log.ErrorContext(ctx, "onceamqp: stopped: the engine cannot run any delivery", "err", err)
			c.mu.Lock()
			c.ended = err
			c.mu.Unlock()
		}
	}()
	return nil
}

// Stop stops consuming and returns once the executions under way have
// finished and settled their deliveries, or ShutdownTimeout has passed
// (their contexts are then canceled), and the channel is closed: the
// broker requeues every delivery left unsettled. It is safe to call twice,
// or without Start.
func (c *Consumer) Stop() { c.life.Stop() }

// Started returns a channel closed once the consumer has started (its
// workers are up; the broker may not be reached yet: see Connected).
func (c *Consumer) Started() <-chan struct{} { return c.life.Started() }

// Stopped returns a channel closed once the consumer started last has
// stopped (closed already when it is not running).
func (c *Consumer) Stopped() <-chan struct{} { return c.life.Stopped() }

// Connected reports whether the consumer is consuming on a live
// connection now (a readiness check).
func (c *Consumer) Connected() bool { return c.connected.Load() }

// consume is the consumer's loop (see Run).
func (c *Consumer) consume(ctx context.Context, started func()) {
	// Executions run on a context of their own: the end of ctx stops the
	// intake, and only the shutdown bound cancels what is under way.
	execCtx, cancelExecutions := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelExecutions()
	work := make(chan amqp.Delivery)
	var workers sync.WaitGroup
	for range c.opts.Workers {
		workers.Go(func() {
			for d := range work {
				if c.opts.BatchSize == 1 {
					c.handle(execCtx, d)
					continue
				}
				c.handleBatch(execCtx, consume.Collect(d, work, c.opts.BatchSize, c.opts.BatchLinger, nil))
			}
		})
	}
	c.holds.start()
	started()
	last := c.connectLoop(ctx, work)
	if last != nil {
		last.cancel(c.tag) // no more deliveries; the prefetched ones stay unsettled
	}
	close(work)
	c.awaitWorkers(&workers, cancelExecutions)
	c.holds.stop()
	if last != nil {
		last.close()
	}
	c.log.Info("onceamqp: stopped consuming")
}

// awaitWorkers waits for the workers to finish their deliveries, at most
// ShutdownTimeout, then cancels the executions' contexts and waits a little
// more for the handlers to notice.
func (c *Consumer) awaitWorkers(workers *sync.WaitGroup, cancel context.CancelFunc) {
	done := make(chan struct{})
	go func() {
		workers.Wait()
		close(done)
	}()
	bound := time.NewTimer(c.opts.ShutdownTimeout)
	defer bound.Stop()
	select {
	case <-done:
		return
	case <-bound.C:
	}
	c.log.Warn("onceamqp: executions still running at the shutdown bound: canceling them", "shutdown_timeout", c.opts.ShutdownTimeout)
	cancel()
	grace := time.NewTimer(cancelGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		c.log.Error("onceamqp: handlers ignore their canceled context; leaving them running", "after", cancelGrace)
	}
}

// cancelGrace is how long Stop still waits for handlers whose context it
// canceled.
const cancelGrace = time.Second
