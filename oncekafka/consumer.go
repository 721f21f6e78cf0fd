package oncekafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

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
	// recorded it (Options.Payload; the record's value by default).
	Payload []byte
	// Record is the Kafka record being handled; nil when Engine.Resume
	// finishes the message after the process running it died.
	Record *kgo.Record
}

// Handler is the work of a message that may call systems outside Postgres:
// each external call runs through onceonly.Step, then the business writes
// go through onceonly.Tx(ctx), which commits together with the key's
// completion. Returning nil settles the record after that commit; an
// error fails the key (or hands it off when a step's outcome is unknown)
// and the record runs again (see the package comment). Wrap
// onceonly.ErrInvalidMessage to dead-letter the record as invalid at once.
//
// A Handler must depend on msg.Scope, msg.Key and msg.Payload alone: when
// its process dies after a step started, a live engine's Resume runs it
// again from the stored payload, with no record (msg.Record nil).
type Handler func(ctx context.Context, msg Message) error

// TxHandler is the work of a message that only writes to Postgres: its
// writes go through tx, which commits together with the key's completion.
// Errors as for Handler.
type TxHandler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Defaults of Options.
const (
	// DefaultKeyHeader is the header Options.Key reads by default.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultWorkers is Options.Workers when unset.
	DefaultWorkers = 4
	// DefaultPartitionWindow is Options.PartitionWindow when unset.
	DefaultPartitionWindow = 256
	// DefaultCommitInterval is Options.CommitInterval when unset.
	DefaultCommitInterval = time.Second
	// DefaultShutdownTimeout is Options.ShutdownTimeout when unset.
	DefaultShutdownTimeout = 8 * time.Second
	// DefaultRequestTimeout is Options.RequestTimeout when unset.
	DefaultRequestTimeout = 5 * time.Second
)

// The headers a dead letter carries besides the original record's.
const (
	// HeaderReason names why the record was dead-lettered: one of
	// onceonly.ReasonReused, ReasonInvalid, ReasonFailed.
	HeaderReason = "Onceonly-Reason"
	// HeaderError is the error that dead-lettered it, for people.
	HeaderError = "Onceonly-Error"
	// HeaderTopic, HeaderPartition and HeaderOffset say where the
	// original record is: a dead letter produced twice (a crash between
	// its production and the offset commit) carries the same three.
	HeaderTopic     = "Onceonly-Topic"
	HeaderPartition = "Onceonly-Partition"
	HeaderOffset    = "Onceonly-Offset"
)

// Options configures a Consumer. Brokers, Group, Topics, and Scope or
// ScopeOf are required.
type Options struct {
	// Brokers are the seed brokers, Group the consumer group, Topics the
	// topics consumed. ClientOptions are added to the kgo client's (TLS,
	// SASL, ConsumeResetOffset, balancers…); the consumer sets the group,
	// the topics, manual commits, BlockRebalanceOnPoll and the partition
	// callbacks itself, and a group's first members start at the
	// earliest offset unless ClientOptions say otherwise.
	Brokers       []string
	Group         string
	Topics        []string
	ClientOptions []kgo.Opt

	// Scope is the scope of every message's key (the tenant, or the
	// message type). ScopeOf, when set, takes it from each record instead.
	Scope   string
	ScopeOf func(rec *kgo.Record) (string, error)
	// Key returns a record's idempotency key; default
	// HeaderKey(DefaultKeyHeader). It must name the logical message, as
	// its producer made it once: never the record's offset, and not the
	// record's Kafka key, which names a partitioning entity (an account,
	// an order) that many messages share.
	Key func(rec *kgo.Record) (string, error)
	// Payload returns what the key's first execution is compared with and
	// what the handler gets as Message.Payload; default the record's
	// value. ScopeOf, Key and Payload must be pure functions of the
	// record: an error from any of them dead-letters it as invalid.
	Payload func(rec *kgo.Record) ([]byte, error)
	// DeadLetterTopic is where a copy of a dead-lettered record is
	// produced (its key, value and headers, plus HeaderReason and the
	// others) before it counts as settled. Empty: it is settled without a
	// copy, its reason only logged and counted.
	DeadLetterTopic string

	// Name is the name NewConsumer registers the Handler under with the
	// engine, the same in every process of the group (default "kafka." +
	// Group).
	Name string
	// Workers is how many records are handled at once (default
	// DefaultWorkers).
	Workers int
	// PartitionWindow bounds the records of one partition taken from
	// Kafka and not yet settled (running, waiting for a worker or for a
	// retry, or settled behind an unsettled one): at the bound the
	// partition is paused until its oldest records settle (default
	// DefaultPartitionWindow). A poll may go past it by up to MaxPoll.
	PartitionWindow int
	// MaxPoll is how many records one poll takes (default 4 × Workers).
	MaxPoll int
	// CommitInterval is how often the settled prefix of each partition is
	// committed (default DefaultCommitInterval); it is committed too when
	// a partition is revoked and at Stop.
	CommitInterval time.Duration
	// Policy turns the engine's answers into settlements, retries and
	// dead letters (MaxFailures, MinBackoff, MaxBackoff).
	Policy onceonly.SettlePolicy
	// ShutdownTimeout bounds how long Stop waits for the executions under
	// way before canceling their contexts (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// RequestTimeout bounds an offset commit and a dead letter's
	// production (default DefaultRequestTimeout).
	RequestTimeout time.Duration
	// Settled, when set, is called after each record is handled: settled
	// (s.Disposition Ack or DeadLetter) or to run again (Retry, s.After).
	// It runs on the worker, so it must return quickly.
	Settled func(rec *kgo.Record, s onceonly.Settlement)
	// Logger receives the consumer's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the consumer's Prometheus metrics; nil keeps
	// them unregistered. Consumers of several groups may share one.
	Registerer prometheus.Registerer
}

// Consumer is one member of a Kafka consumer group, running each logical
// message once through an onceonly.Engine. Create it with NewConsumer or
// NewTxConsumer; it is safe for concurrent use.
type Consumer struct {
	life    startstop.Base
	engine  *onceonly.Engine
	opts    Options
	exec    *consume.Executor[*kgo.Record]
	log     *slog.Logger
	metrics *metrics
	joined  atomic.Bool
	mu      sync.Mutex
	ended   error // why the loop ended by itself
}

// NewConsumer returns a consumer running fn, and registers fn with engine
// under opts.Name so that engine.Resume can finish an execution whose
// process died after a step started.
func NewConsumer(engine *onceonly.Engine, fn Handler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncekafka: a Handler is required")
	}
	return newConsumer(engine, opts, consume.Work[*kgo.Record]{Handler: func(ctx context.Context, id consume.Identity, rec *kgo.Record) error {
		return fn(ctx, message(id, rec))
	}})
}

// NewTxConsumer returns a consumer running fn, a handler that only writes
// to Postgres (through Engine.Do).
func NewTxConsumer(engine *onceonly.Engine, fn TxHandler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncekafka: a TxHandler is required")
	}
	return newConsumer(engine, opts, consume.Work[*kgo.Record]{Tx: func(ctx context.Context, tx pgx.Tx, id consume.Identity, rec *kgo.Record) error {
		return fn(ctx, tx, message(id, rec))
	}})
}

func newConsumer(engine *onceonly.Engine, opts Options, w consume.Work[*kgo.Record]) (*Consumer, error) {
	switch {
	case engine == nil:
		return nil, errors.New("oncekafka: an Engine is required")
	case len(opts.Brokers) == 0:
		return nil, errors.New("oncekafka: Options.Brokers is required")
	case opts.Group == "" || len(opts.Topics) == 0:
		return nil, errors.New("oncekafka: Options.Group and Options.Topics are required")
	case opts.Scope == "" && opts.ScopeOf == nil:
		return nil, errors.New("oncekafka: Options.Scope or Options.ScopeOf is required")
	case opts.Workers < 0, opts.PartitionWindow < 0, opts.MaxPoll < 0, opts.CommitInterval < 0, opts.ShutdownTimeout < 0, opts.RequestTimeout < 0:
		return nil, errors.New("oncekafka: Options.Workers, PartitionWindow, MaxPoll, CommitInterval, ShutdownTimeout and RequestTimeout must not be negative")
	}
	for _, t := range opts.Topics {
		if t == opts.DeadLetterTopic {
			return nil, fmt.Errorf("oncekafka: the dead-letter topic %s is consumed", t)
		}
	}
	if opts.Name == "" {
		opts.Name = "kafka." + opts.Group
	}
	if opts.Key == nil {
		opts.Key = HeaderKey(DefaultKeyHeader)
	}
	if err := identifier(opts).CheckScope(); err != nil {
		return nil, fmt.Errorf("oncekafka: %w", err)
	}
	if opts.Workers == 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.PartitionWindow == 0 {
		opts.PartitionWindow = DefaultPartitionWindow
	}
	if opts.MaxPoll == 0 {
		opts.MaxPoll = 4 * opts.Workers
	}
	if opts.CommitInterval == 0 {
		opts.CommitInterval = DefaultCommitInterval
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m, err := newMetrics(opts.Registerer, opts.Group)
	if err != nil {
		return nil, fmt.Errorf("oncekafka: %w", err)
	}
	c := &Consumer{
		engine:  engine,
		opts:    opts,
		log:     opts.Logger.With("group", opts.Group),
		metrics: m,
	}
	if c.exec, err = consume.New(c.config(), opts.Name, w); err != nil {
		return nil, err
	}
	return c, nil
}

// Run consumes until ctx ends or Stop is called and returns nil after a
// graceful stop (see Stop). kgo reconnects to the brokers and rejoins the
// group by itself; Run returns an error when the client cannot be
// created, and stops by itself with an error no record can get past
// (onceonly.ErrSchemaBehind, onceonly.ErrNotMade: see consume.Fatal),
// leaving that record uncommitted, for the member that runs once it is
// fixed.
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
		err := c.consume(ctx)
		if fatal := consume.Cause(ctx); fatal != nil {
			err = fatal
		}
		if err != nil {
			c.log.ErrorContext(ctx, "oncekafka: stopped consuming", "err", err)
			c.mu.Lock()
			c.ended = err
			c.mu.Unlock()
			return
		}
		c.log.InfoContext(ctx, "oncekafka: stopped consuming")
	}()
	return nil
}

// Stop stops polling, lets the executions under way finish and settle for
// up to ShutdownTimeout (then cancels their contexts), commits the settled
// prefix of every partition and leaves the group: the records it held
// unsettled go to the partitions' next owners. The commit and the leave
// are bounded by RequestTimeout each. It is safe to call twice, or
// without Start.
func (c *Consumer) Stop() { c.life.Stop() }

// Started returns a channel closed once the consumer has started.
func (c *Consumer) Started() <-chan struct{} { return c.life.Started() }

// Stopped returns a channel closed once the consumer started last has
// stopped (closed already when it is not running).
func (c *Consumer) Stopped() <-chan struct{} { return c.life.Stopped() }

// Joined reports whether the consumer owns partitions of the group now (a
// readiness check).
func (c *Consumer) Joined() bool { return c.joined.Load() }
