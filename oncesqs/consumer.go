package oncesqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
	"github.com/onceonly/onceonly/startstop"
)

// API is the part of *sqs.Client a Consumer calls.
type API interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

var _ API = (*sqs.Client)(nil)

// Message is one logical message as a handler sees it.
type Message struct {
	// Scope and Key identify the message (Options.Scope or ScopeOf,
	// Options.Key).
	Scope, Key string
	// Payload is the message's content as the key's first execution
	// recorded it (Options.Payload; the body by default).
	Payload []byte
	// Msg is the SQS message being handled; nil when Engine.Resume
	// finishes the message after the process running it died.
	Msg *types.Message
}

// Handler is the work of a message that may call systems outside Postgres:
// each external call runs through onceonly.Step, then the business writes
// go through onceonly.Tx(ctx), which commits together with the key's
// completion. Returning nil deletes the message after that commit; an
// error fails the key (or hands it off when a step's outcome is unknown)
// and the message comes again (see the package comment). Wrap
// onceonly.ErrInvalidMessage to dead-letter the message as invalid at once.
//
// A Handler must depend on msg.Scope, msg.Key and msg.Payload alone: when
// its process dies after a step started, a live engine's Resume runs it
// again from the stored payload, with no SQS message (msg.Msg nil).
type Handler func(ctx context.Context, msg Message) error

// TxHandler is the work of a message that only writes to Postgres: its
// writes go through tx, which commits together with the key's completion.
// Errors as for Handler.
type TxHandler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Defaults of Options.
const (
	// DefaultKeyAttribute is the message attribute Options.Key reads by
	// default.
	DefaultKeyAttribute = "Idempotency-Key"
	// DefaultWorkers is Options.Workers when unset.
	DefaultWorkers = 10
	// DefaultReceivers is Options.Receivers when unset.
	DefaultReceivers = 1
	// DefaultWaitTime is Options.WaitTime when unset: the longest long
	// poll SQS allows.
	DefaultWaitTime = 20 * time.Second
	// DefaultShutdownTimeout is Options.ShutdownTimeout when unset.
	DefaultShutdownTimeout = 8 * time.Second
	// DefaultCallTimeout is Options.CallTimeout when unset.
	DefaultCallTimeout = 5 * time.Second
	// DefaultRetryMin and DefaultRetryMax bound the backoff between
	// failed receives (and failed reads of the queue's attributes).
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
)

// The message attributes a dead letter carries besides the original
// message's (SQS allows 10 a message: see the package comment).
const (
	// AttributeReason names why the message was dead-lettered: one of
	// onceonly.ReasonReused, ReasonInvalid, ReasonFailed.
	AttributeReason = "Onceonly-Reason"
	// AttributeError is the error that dead-lettered it, for people.
	AttributeError = "Onceonly-Error"
)

// maxAttributes is how many message attributes SQS takes a message.
const maxAttributes = 10

// maxVisibility is the longest visibility timeout SQS takes (12 hours).
const maxVisibility = 12 * time.Hour

// Options configures a Consumer. Client, QueueURL, and Scope or ScopeOf
// are required.
type Options struct {
	// Client calls SQS: an *sqs.Client (its retries and timeouts apply).
	Client API
	// QueueURL is the queue consumed. Give it no redrive policy, or one
	// whose maxReceiveCount is high (see the package comment): the
	// consumer dead-letters by itself.
	QueueURL string
	// DeadLetterQueueURL is where a copy of a dead-lettered message is
	// sent before the message is deleted; a FIFO queue when QueueURL is
	// one. Empty: the message is deleted without a copy, its reason only
	// logged and counted.
	DeadLetterQueueURL string

	// Scope is the scope of every message's key (the tenant, or the
	// message type). ScopeOf, when set, takes it from each message instead.
	Scope   string
	ScopeOf func(msg *types.Message) (string, error)
	// Key returns a message's idempotency key; default
	// AttributeKey(DefaultKeyAttribute). It must name the logical message,
	// as its producer made it once; never the MessageId, which SQS gives
	// each send.
	Key func(msg *types.Message) (string, error)
	// Payload returns what the key's first execution is compared with and
	// what the handler gets as Message.Payload; default the body.
	//
	// ScopeOf, Key and Payload must be pure functions of the message: an
	// error from any of them dead-letters the message as invalid
	// (onceonly.ReasonInvalid), and no key row is written.
	Payload func(msg *types.Message) ([]byte, error)

	// Name is the name NewConsumer registers the Handler under with the
	// engine, the same in every process consuming these messages (default
	// "sqs." + the queue's name).
	Name string
	// Workers is how many messages are handled at once (default
	// DefaultWorkers). A receive asks for at most as many messages as
	// workers are free (10 at most), so no message waits for a worker
	// while its visibility timeout runs.
	Workers int
	// Receivers is how many long polls run at once (default
	// DefaultReceivers).
	Receivers int
	// WaitTime is the long poll's wait (WaitTimeSeconds; whole seconds, at
	// most 20 s; default DefaultWaitTime). Stop cancels a poll under way.
	WaitTime time.Duration
	// VisibilityTimeout, when set, is asked for on each receive instead of
	// the queue's (whole seconds); the heartbeat extends a message's by it.
	VisibilityTimeout time.Duration
	// Policy turns the engine's answers into deletes, visibility changes
	// and dead letters (MaxFailures, MinBackoff, MaxBackoff).
	Policy onceonly.SettlePolicy
	// LeaseTimeout is the engine's Config.LeaseTimeout when not the
	// default: a message whose execution runs has its visibility extended
	// every third of the shorter of it and the visibility timeout.
	LeaseTimeout time.Duration
	// ShutdownTimeout bounds how long Stop waits for the executions under
	// way before canceling their contexts (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// CallTimeout bounds each settling call to SQS: a delete, a visibility
	// change, a dead letter's send (default DefaultCallTimeout).
	CallTimeout time.Duration
	// Settled, when set, is called after each message is settled: deleted,
	// dead-lettered, or made visible again later (s.Disposition Retry,
	// s.After); not for the messages Stop hands back unstarted. It runs on
	// the worker that handled the message, so it must return quickly.
	Settled func(msg *types.Message, s onceonly.Settlement)
	// Logger receives the consumer's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the consumer's Prometheus metrics; nil keeps
	// them unregistered. Consumers of several queues may share one.
	Registerer prometheus.Registerer
}

// Consumer consumes one SQS queue, running each logical message once
// through an onceonly.Engine. Create it with NewConsumer or NewTxConsumer;
// it is safe for concurrent use.
type Consumer struct {
	life      startstop.Base
	engine    *onceonly.Engine
	opts      Options
	queue     string // the queue's name, for logs and metrics
	exec      *consume.Executor[*types.Message]
	log       *slog.Logger
	metrics   *metrics
	receiving atomic.Bool
	mu        sync.Mutex
	ended     error // the Fatal error the consumer started last stopped on
}

// NewConsumer returns a consumer running fn, and registers fn with engine
// under opts.Name so that engine.Resume can finish an execution whose
// process died after a step started. Every process consuming these
// messages must create the consumer (which registers it) and run
// engine.Resume.
func NewConsumer(engine *onceonly.Engine, fn Handler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncesqs: a Handler is required")
	}
	return newConsumer(engine, opts, consume.Work[*types.Message]{Handler: func(ctx context.Context, id consume.Identity, msg *types.Message) error {
		return fn(ctx, message(id, msg))
	}})
}

// NewTxConsumer returns a consumer running fn, a handler that only writes
// to Postgres (through Engine.Do).
func NewTxConsumer(engine *onceonly.Engine, fn TxHandler, opts Options) (*Consumer, error) {
	if fn == nil {
		return nil, errors.New("oncesqs: a TxHandler is required")
	}
	return newConsumer(engine, opts, consume.Work[*types.Message]{Tx: func(ctx context.Context, tx pgx.Tx, id consume.Identity, msg *types.Message) error {
		return fn(ctx, tx, message(id, msg))
	}})
}

func newConsumer(engine *onceonly.Engine, opts Options, w consume.Work[*types.Message]) (*Consumer, error) {
	switch {
	case engine == nil:
		return nil, errors.New("oncesqs: an Engine is required")
	case opts.Client == nil:
		return nil, errors.New("oncesqs: Options.Client is required")
	case opts.QueueURL == "":
		return nil, errors.New("oncesqs: Options.QueueURL is required")
	case opts.Scope == "" && opts.ScopeOf == nil:
		return nil, errors.New("oncesqs: Options.Scope or Options.ScopeOf is required")
	case opts.Workers < 0, opts.Receivers < 0, opts.WaitTime < 0, opts.VisibilityTimeout < 0,
		opts.LeaseTimeout < 0, opts.ShutdownTimeout < 0, opts.CallTimeout < 0:
		return nil, errors.New("oncesqs: Options.Workers, Receivers, WaitTime, VisibilityTimeout, LeaseTimeout, ShutdownTimeout and CallTimeout must not be negative")
	case opts.WaitTime > 20*time.Second:
		return nil, errors.New("oncesqs: Options.WaitTime is at most 20s")
	case opts.VisibilityTimeout > maxVisibility:
		return nil, errors.New("oncesqs: Options.VisibilityTimeout is at most 12h")
	case opts.DeadLetterQueueURL != "" && isFIFO(opts.QueueURL) != isFIFO(opts.DeadLetterQueueURL):
		return nil, errors.New("oncesqs: Options.DeadLetterQueueURL must be a FIFO queue when QueueURL is one, and only then")
	}
	queue := queueName(opts.QueueURL)
	if opts.Name == "" {
		opts.Name = "sqs." + queue
	}
	if opts.Key == nil {
		opts.Key = AttributeKey(DefaultKeyAttribute)
	}
	if err := identifier(opts).CheckScope(); err != nil {
		return nil, fmt.Errorf("oncesqs: %w", err)
	}
	if opts.Workers == 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.Receivers == 0 {
		opts.Receivers = DefaultReceivers
	}
	if opts.WaitTime == 0 {
		opts.WaitTime = DefaultWaitTime
	}
	if opts.LeaseTimeout == 0 {
		opts.LeaseTimeout = onceonly.DefaultLeaseTimeout
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.CallTimeout == 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m, err := newMetrics(opts.Registerer, queue)
	if err != nil {
		return nil, fmt.Errorf("oncesqs: %w", err)
	}
	c := &Consumer{
		engine:  engine,
		opts:    opts,
		queue:   queue,
		log:     opts.Logger.With("queue", queue),
		metrics: m,
	}
	if c.exec, err = consume.New(c.config(), opts.Name, w); err != nil {
		return nil, err
	}
	return c, nil
}

// Run consumes until ctx ends or Stop is called and returns nil after a
// graceful stop (see Stop). A failed receive (SQS unreachable, the queue
// missing, credentials refused) is logged, counted and tried again with
// backoff; Run does not end for it. Run stops by itself with an error no
// message can get past (onceonly.ErrSchemaBehind, onceonly.ErrNotMade:
// see consume.Fatal), making that message visible again, undeleted, for
// the consumer that runs once it is fixed.
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
		c.loop(ctx)
		if fatal := consume.Cause(ctx); fatal != nil {
			c.log.ErrorContext(ctx, "oncesqs: stopped consuming", "err", fatal)
			c.mu.Lock()
			c.ended = fatal
			c.mu.Unlock()
			return
		}
		c.log.InfoContext(ctx, "oncesqs: stopped consuming")
	}()
	return nil
}

// Stop stops receiving (a long poll under way is canceled), lets the
// executions under way finish and settle for up to ShutdownTimeout (then
// cancels their contexts), and makes the messages received while it
// stopped visible again at once, unstarted. A message it could not settle
// comes back after its visibility timeout. It is safe to call twice, or
// without Start.
func (c *Consumer) Stop() { c.life.Stop() }

// Started returns a channel closed once the consumer has started.
func (c *Consumer) Started() <-chan struct{} { return c.life.Started() }

// Stopped returns a channel closed once the consumer started last has
// stopped (closed already when it is not running).
func (c *Consumer) Stopped() <-chan struct{} { return c.life.Stopped() }

// Connected reports whether the consumer's last receive succeeded (a
// readiness check).
func (c *Consumer) Connected() bool { return c.receiving.Load() }

// loop reads the queue's attributes, then receives and handles messages
// until ctx ends, then shuts down.
func (c *Consumer) loop(ctx context.Context) {
	visibility, ok := c.visibility(ctx)
	if !ok {
		return
	}
	every := heartbeatInterval(visibility, c.opts.LeaseTimeout)
	// Executions run on a context of their own: the end of ctx stops the
	// intake, and only the shutdown bound cancels what is under way.
	execCtx, cancelExecutions := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelExecutions()
	del := newDeleter(execCtx, c, max(1, (c.opts.Workers+maxBatch-1)/maxBatch))
	defer del.close()

	var (
		slots     = make(chan struct{}, c.opts.Workers) // one per message handled
		workers   sync.WaitGroup
		receivers sync.WaitGroup
	)
	for range c.opts.Receivers {
		receivers.Go(func() {
			c.receive(ctx, slots, func(msg *types.Message) {
				workers.Go(func() {
					defer func() { <-slots }()
					c.handle(execCtx, msg, del, visibility, every)
				})
			})
		})
	}
	receivers.Wait()
	c.receiving.Store(false)

	idle := make(chan struct{})
	go func() { workers.Wait(); close(idle) }()
	bound := time.NewTimer(c.opts.ShutdownTimeout)
	defer bound.Stop()
	select {
	case <-idle:
	case <-bound.C:
		c.log.WarnContext(ctx, "oncesqs: executions still running at the shutdown bound: canceling them", "shutdown_timeout", c.opts.ShutdownTimeout)
		cancelExecutions()
		<-idle
	}
}

// visibility returns the visibility timeout messages are received with:
// Options.VisibilityTimeout, or the queue's, read (with backoff) until ctx
// ends (false). It warns about a redrive policy.
func (c *Consumer) visibility(ctx context.Context) (time.Duration, bool) {
	wait := DefaultRetryMin
	for {
		actx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		out, err := c.opts.Client.GetQueueAttributes(actx, &sqs.GetQueueAttributesInput{
			QueueUrl:       aws.String(c.opts.QueueURL),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout, types.QueueAttributeNameRedrivePolicy},
		})
		cancel()
		if err == nil {
			if rp := out.Attributes[string(types.QueueAttributeNameRedrivePolicy)]; redriveCount(rp) > 0 {
				c.log.WarnContext(ctx, "oncesqs: the queue has a redrive policy: SQS counts every receive against maxReceiveCount, those of a copy whose key is in flight elsewhere or handed off too, and moves a message past it to its dead-letter queue without a reason; the consumer dead-letters by itself", "redrive_policy", rp)
			}
			if c.opts.VisibilityTimeout > 0 {
				return c.opts.VisibilityTimeout, true
			}
			secs, err := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
			if err == nil && secs > 0 {
				return time.Duration(secs) * time.Second, true
			}
			return 30 * time.Second, true // SQS's default
		}
		c.metrics.settleErrors.WithLabelValues(opAttributes).Inc()
		c.log.WarnContext(ctx, "oncesqs: reading the queue's attributes failed; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return 0, false
		case <-time.After(wait):
		}
		wait = min(2*wait, DefaultRetryMax)
	}
}

// receive long-polls the queue for as many messages as workers are free
// and hands each to run, until ctx ends.
func (c *Consumer) receive(ctx context.Context, slots chan struct{}, run func(msg *types.Message)) {
	wait := DefaultRetryMin
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(c.opts.QueueURL),
		WaitTimeSeconds:             seconds32(c.opts.WaitTime),
		VisibilityTimeout:           seconds32(c.opts.VisibilityTimeout),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	}
	for {
		// One free worker at least, then as many more as are free now.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < maxBatch {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		in.MaxNumberOfMessages = int32(n)
		out, err := c.opts.Client.ReceiveMessage(ctx, in)
		var msgs []types.Message
		if out != nil {
			msgs = out.Messages
		}
		for range n - len(msgs) {
			<-slots
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.receiving.Store(false)
			c.metrics.settleErrors.WithLabelValues(opReceive).Inc()
			c.log.WarnContext(ctx, "oncesqs: receive failed; trying again", "err", err, "in", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, DefaultRetryMax)
			continue
		}
		wait = DefaultRetryMin
		c.receiving.Store(true)
		if ctx.Err() != nil {
			c.handBack(ctx, msgs)
			for range msgs {
				<-slots
			}
			return
		}
		for i := range msgs {
			run(&msgs[i])
		}
	}
}

// handBack makes messages received while the consumer stops visible again
// at once, unstarted.
func (c *Consumer) handBack(ctx context.Context, msgs []types.Message) {
	if len(msgs) == 0 {
		return
	}
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}
	}
	c.metrics.messages.WithLabelValues(onceonly.Retry.String(), reasonShutdown).Add(float64(len(msgs)))
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CallTimeout)
	defer cancel()
	out, err := c.opts.Client.ChangeMessageVisibilityBatch(actx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(c.opts.QueueURL), Entries: entries})
	if err == nil && len(out.Failed) > 0 {
		err = fmt.Errorf("%d of %d failed: %s: %s", len(out.Failed), len(entries), aws.ToString(out.Failed[0].Code), aws.ToString(out.Failed[0].Message))
	}
	if err != nil {
		c.metrics.settleErrors.WithLabelValues(opVisibility).Inc()
		c.log.WarnContext(ctx, "oncesqs: handing messages back failed: they come back after their visibility timeout", "err", err)
	}
}

// heartbeatInterval is how often a message whose execution runs has its
// visibility extended: a third of the shorter of the visibility timeout
// and the engine's lease, the cadence at which the engine renews the
// lease. The message stays hidden exactly as long as its execution keeps
// the key, and once its process is gone it comes back about when the
// lease runs out and a takeover can finish the key.
func heartbeatInterval(visibility, lease time.Duration) time.Duration {
	return max(min(visibility, lease)/3, 10*time.Millisecond)
}

// visibilitySeconds is d in whole seconds for ChangeMessageVisibility,
// rounded up (a Retry-After of 200 ms waits a second, never none), at most
// 12 hours.
func visibilitySeconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	return int32((min(d, maxVisibility) + time.Second - 1) / time.Second)
}

// redriveCount returns the maxReceiveCount of a RedrivePolicy attribute
// (0 when there is none).
func redriveCount(policy string) int {
	_, rest, ok := strings.Cut(policy, `"maxReceiveCount"`)
	if !ok {
		return 0
	}
	rest = strings.TrimLeft(rest, ` :"`)
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end >= 0 {
		rest = rest[:end]
	}
	n, _ := strconv.Atoi(rest)
	return n
}

// isFIFO reports whether a queue URL names a FIFO queue.
func isFIFO(url string) bool { return strings.HasSuffix(url, ".fifo") }

// queueName is the last segment of a queue URL.
func queueName(url string) string {
	return url[strings.LastIndex(url, "/")+1:]
}

// seconds32 is d in whole seconds as SQS's int32 fields take them, clamped
// to int32's range (SQS's own limits are far below it: 20 s of long poll,
// 12 h of visibility).
func seconds32(d time.Duration) int32 {
	return int32(min(max(d/time.Second, 0), math.MaxInt32))
}
