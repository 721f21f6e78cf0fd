package onceriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// Keyed is implemented by job args that carry the idempotency key of the
// logical message they stand for: the producer's message ID, an order ID, a
// (customer, billing period) pair. Two jobs whose args return the same key
// are one message delivered twice.
//
// The key is never the job's ID: a producer that inserts the same logical
// message twice (an enqueue retried after a timeout, an at-least-once
// upstream consumer) makes two jobs with two IDs, and both would run.
type Keyed interface {
	IdempotencyKey() string
}

// Handler is the work of a job that calls systems outside Postgres. Each
// external call runs through onceonly.Step (with the downstream key it is
// given), then the business writes go through onceonly.Tx(ctx), which
// commits together with the key's completion and the job's. Returning nil
// completes the job; an error fails the execution, and River retries the
// job with its backoff until Options.Policy says the key failed too often
// (see Worker). A river.JobCancel or river.JobSnooze error is River's to
// act on, as it is.
//
// A Handler must depend on args alone: when the process running it dies
// after a step started, a live engine's Resume runs it again from the
// stored args, without a River job (JobFromContext then reports false).
type Handler[T river.JobArgs] func(ctx context.Context, args T) error

// TxHandler is the work of a job that only writes to Postgres: its writes
// go through tx, which commits together with the key's completion and the
// job's. It cannot call onceonly.Step (the transaction is already open);
// use Handler for external calls. Errors as for Handler.
type TxHandler[T river.JobArgs] func(ctx context.Context, tx pgx.Tx, job *river.Job[T]) error

// Options configures a Worker. The zero value takes the key from args that
// implement Keyed and uses the job kind as the scope.
type Options[T river.JobArgs] struct {
	// Scope is the scope of the job's keys (default: the job kind). Workers
	// of two kinds that carry the same logical message must share a scope
	// to share its keys.
	Scope string
	// Key returns the idempotency key of a job's args (default: the args'
	// IdempotencyKey, which T must then implement). An empty or invalid key
	// cancels the job.
	Key func(args T) string
	// Name is the name the Handler is registered under with the engine, the
	// same in every process that works the kind (default: "river." + the
	// job kind). Only NewWorker uses it.
	Name string
	// Timeout is the job's timeout, River's Worker.Timeout (default 0:
	// Config.JobTimeout). Keep it below the engine's LeaseTimeout minus a
	// sixth, so River gives up on a job before the engine does.
	Timeout time.Duration
	// Logger receives the worker's rare warnings (default slog.Default()).
	Logger *slog.Logger
	// Policy settles each attempt's answer (see Worker). Its MaxFailures
	// is how many executions of a key may fail before a job carrying it is
	// cancelled (default onceonly.DefaultMaxFailures); its MinBackoff is
	// the snooze of a job whose execution was handed off. The retries of
	// failed executions are River's, on its RetryPolicy.
	Policy onceonly.SettlePolicy
	// Stop is called once, on a goroutine of its own, when the engine
	// cannot run any job: its schema is missing or behind
	// (onceonly.ErrSchemaBehind: run migrations.Up) or it was not made by
	// onceonly.New (onceonly.ErrNotMade). Default: stop the River client
	// the job runs in (Client.Stop), whose Stopped channel then closes.
	// Either way the job is snoozed for Policy.MinBackoff, which uses up no
	// attempt, and never cancelled, and the error is logged.
	Stop func(err error)
}

// Worker is a river.Worker[T] that runs its handler once per logical
// message (scope, key) however often River runs the job, and however many
// jobs carry the message. Add it with river.AddWorker.
//
// What each attempt of a job turns into, as Options.Policy settles the
// engine's answer (onceonly.SettlePolicy.Settle):
//
//   - first run: the handler runs; its writes, the key's completion and the
//     job's completion (river.JobCompleteTx) commit in one transaction;
//   - the key is completed already (a duplicate job, or a run after a
//     resumption finished the message): the handler does not run and the
//     job completes (Ack);
//   - the key is held by a live execution (*onceonly.InFlightError): the job
//     is snoozed (river.JobSnooze), which does not use up an attempt, for
//     the settlement's After: at most onceonly.MaxInFlightRetry, as a live
//     holder usually finishes long before its lease would end;
//   - the execution was handed off (a step's outcome is unknown): the job
//     is snoozed for Policy.MinBackoff; a resumption or its next run
//     finishes the execution, and no failure is counted;
//   - the handler failed: its error goes back to River, which records it,
//     uses up an attempt and retries on its RetryPolicy, so River's attempt
//     count is the runs that failed; once Policy.MaxFailures executions of
//     the key failed (this run's included), the job is cancelled
//     (river.JobCancel, DeadLetter with reason failed) instead. A job of the
//     same key inserted later runs again, once. A handler that returns
//     river.JobCancel or river.JobSnooze itself gets what it asked for;
//   - the key was used with other args (onceonly.ErrKeyReused), or the key
//     or scope is invalid: the job is cancelled (DeadLetter); retrying
//     cannot help;
//   - Postgres unreachable (onceonly.ErrUnavailable) or a lost lease: the
//     error goes back to River, which retries;
//   - the engine cannot run any job (its schema is missing or behind,
//     onceonly.ErrSchemaBehind): the job is snoozed and the River client
//     stopped (Options.Stop).
type Worker[T river.JobArgs] struct {
	river.WorkerDefaults[T]

	engine    *onceonly.Engine
	scope     string
	key       func(T) string
	name      string       // registered name; "" for a TxHandler
	handler   Handler[T]   // set by NewWorker
	txHandler TxHandler[T] // set by NewTxWorker
	timeout   time.Duration
	log       *slog.Logger
	policy    onceonly.SettlePolicy
	stop      func(err error) // Options.Stop; nil: stop the job's client
	stopOnce  sync.Once
}

// NewWorker returns a worker running fn, and registers fn with engine under
// opts.Name so that engine.Resume can finish an execution whose process
// died after a step started. Every process working the kind must create
// the worker (which registers it) and run engine.Resume.
func NewWorker[T river.JobArgs](engine *onceonly.Engine, fn Handler[T], opts Options[T]) (*Worker[T], error) {
	if fn == nil {
		return nil, errors.New("onceriver: a Handler is required")
	}
	w, err := newWorker(engine, opts)
	if err != nil {
		return nil, err
	}
	w.handler = fn
	w.name = opts.Name
	if w.name == "" {
		w.name = "river." + kindOf[T]()
	}
	if err := engine.Register(w.name, w.execute); err != nil {
		return nil, fmt.Errorf("onceriver: %w", err)
	}
	return w, nil
}

// NewTxWorker returns a worker running fn, a handler that only writes to
// Postgres.
func NewTxWorker[T river.JobArgs](engine *onceonly.Engine, fn TxHandler[T], opts Options[T]) (*Worker[T], error) {
	if fn == nil {
		return nil, errors.New("onceriver: a TxHandler is required")
	}
	w, err := newWorker(engine, opts)
	if err != nil {
		return nil, err
	}
	w.txHandler = fn
	return w, nil
}

func newWorker[T river.JobArgs](engine *onceonly.Engine, opts Options[T]) (*Worker[T], error) {
	if engine == nil {
		return nil, errors.New("onceriver: an Engine is required")
	}
	key := opts.Key
	if key == nil {
		var zero T
		if _, ok := any(zero).(Keyed); !ok {
			return nil, fmt.Errorf("onceriver: %T does not implement Keyed (IdempotencyKey() string) and Options.Key is not set", zero)
		}
		key = func(args T) string {
			k, _ := any(args).(Keyed) // always a Keyed: checked above
			return k.IdempotencyKey()
		}
	}
	scope := opts.Scope
	if scope == "" {
		scope = kindOf[T]()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Worker[T]{engine: engine, scope: scope, key: key, timeout: opts.Timeout, log: log, policy: opts.Policy, stop: opts.Stop}, nil
}

// kindOf returns the job kind of T.
func kindOf[T river.JobArgs]() string {
	var zero T
	return zero.Kind()
}

// Timeout implements river.Worker: Options.Timeout.
func (w *Worker[T]) Timeout(*river.Job[T]) time.Duration { return w.timeout }

// minSnooze is the shortest snooze: a lease about to end is asked about
// again a moment later, not at once.
const minSnooze = 100 * time.Millisecond

// Work implements river.Worker.
func (w *Worker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	key := w.key(job.Args)
	payload := canonicalArgs(job.EncodedArgs)
	ctx = context.WithValue(ctx, jobKey{}, job)
	ctx = context.WithValue(ctx, jobRowKey{}, job.JobRow)
	var (
		out onceonly.Outcome
		err error
	)
	if w.txHandler != nil {
		out, err = w.engine.Do(ctx, w.scope, key, payload, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			if err := w.txHandler(ctx, tx, job); err != nil {
				return onceonly.Result{}, &handlerError{err: err}
			}
			return onceonly.Result{Status: 200}, w.completeJob(ctx, tx, job)
		})
	} else {
		out, err = w.engine.Run(ctx, w.name, w.scope, key, payload)
	}
	if fatal := consume.Fatal(w.policy.Settle(out, err)); fatal != nil {
		return w.halt(ctx, job.JobRow, fatal)
	}
	return w.verdict(job.JobRow, key, out, err)
}

// halt answers a job the engine cannot run, nor any other (see
// consume.Fatal): it stops the River client (Options.Stop), once, and
// snoozes the job, which uses up no attempt and is never cancelled.
func (w *Worker[T]) halt(ctx context.Context, job *rivertype.JobRow, err error) error {
	w.log.ErrorContext(ctx, "onceriver: the engine cannot run any job; stopping", "job_id", job.ID, "kind", job.Kind, "err", err)
	stop := w.stop
	if stop == nil {
		client, cerr := river.ClientFromContextSafely[pgx.Tx](ctx)
		if cerr != nil {
			w.log.ErrorContext(ctx, "onceriver: no River client to stop", "err", cerr)
		} else {
			stop = func(error) { _ = client.Stop(context.WithoutCancel(ctx)) }
		}
	}
	if stop != nil {
		w.stopOnce.Do(func() { go stop(err) })
	}
	return river.JobSnooze(max(w.policy.Backoff(1), minSnooze)) //nolint:wrapcheck // River reads the snooze by its type
}

// execute is the registered onceonly.Func of a Handler: it decodes the
// args from the stored request, runs the handler and, when it runs for a
// River job (not in a resumption), completes that job in the final
// transaction.
func (w *Worker[T]) execute(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	var args T
	if err := json.Unmarshal(x.Request(), &args); err != nil {
		return onceonly.Result{}, &handlerError{err: fmt.Errorf("onceriver: decode the args of key %q: %w", x.Key(), err)}
	}
	if err := w.handler(ctx, args); err != nil {
		return onceonly.Result{}, &handlerError{err: err}
	}
	job, ok := ctx.Value(jobKey{}).(*river.Job[T])
	if !ok {
		// A resumption: the job completes when River runs it again and
		// finds the key completed.
		return onceonly.Result{Status: 200}, nil
	}
	tx, err := x.Tx(ctx)
	if err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: 200}, w.completeJob(ctx, tx, job)
}

// completeJob completes job in tx. A job that is no longer running (River
// rescued it while this attempt still ran) is left alone: the key decides,
// and its next run completes it as a replay.
func (w *Worker[T]) completeJob(ctx context.Context, tx pgx.Tx, job *river.Job[T]) error {
	_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rivertype.ErrNotFound):
		w.log.WarnContext(ctx, "onceriver: job no longer running; completing its key without it", "job_id", job.ID, "kind", job.Kind)
		return nil
	}
	return fmt.Errorf("onceriver: complete job %d in the final transaction: %w", job.ID, err)
}

// verdict turns the engine's answer into what River does with the job:
// the settlement of Options.Policy, in River's verbs (see Worker).
func (w *Worker[T]) verdict(job *rivertype.JobRow, key string, out onceonly.Outcome, err error) error {
	he, fromHandler := errors.AsType[*handlerError](err)
	if fromHandler && riversOwn(he.err) {
		return he.err // the handler cancelled or snoozed its job itself
	}
	s := w.policy.Settle(out, err)
	switch {
	case s.Disposition == onceonly.Ack:
		return nil
	case s.Disposition == onceonly.DeadLetter:
		return river.JobCancel(fmt.Errorf("onceriver: job %d (%s), key %q: %s: %w", job.ID, job.Kind, key, s.Reason, err)) //nolint:wrapcheck // River reads the cancellation by its type; err inside carries the context
	case snoozes(err):
		return river.JobSnooze(max(s.After, minSnooze)) //nolint:wrapcheck // River reads the snooze by its type; it is the job's verdict, not a failure
	case fromHandler:
		return he.err // River records it as the handler returned it, and retries
	}
	return fmt.Errorf("onceriver: job %d (%s), key %q: %w", job.ID, job.Kind, key, err)
}

// snoozes reports whether a job whose answer is err (to be retried) waits
// without using up an attempt: its key is in flight, or its execution was
// handed off; neither is a failure.
func snoozes(err error) bool {
	if _, inFlight := onceonly.IsInFlight(err); inFlight {
		return true
	}
	failed, ok := errors.AsType[*onceonly.ExecutionError](err)
	return ok && failed.HandedOff
}

// riversOwn reports whether err is a verdict River acts on by its type: a
// cancellation or a snooze.
func riversOwn(err error) bool {
	_, cancel := errors.AsType[*river.JobCancelError](err)
	_, snooze := errors.AsType[*river.JobSnoozeError](err)
	return cancel || snooze
}

// handlerError carries the handler's own error through the engine, so it
// reaches River as the handler returned it.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// canonicalArgs returns the job's encoded args in canonical JSON (member
// order and whitespace do not count), the payload the key is fingerprinted
// on; args that are not valid JSON are used as they are.
func canonicalArgs(encoded []byte) []byte {
	if c, err := onceonly.CanonicalJSON(encoded); err == nil {
		return c
	}
	return encoded
}

type (
	jobKey    struct{}
	jobRowKey struct{}
)

// JobFromContext returns the River job a handler runs for. It reports false
// in a resumption (engine.Resume finishing an execution whose process
// died), which runs the handler from the stored args alone.
func JobFromContext(ctx context.Context) (*rivertype.JobRow, bool) {
	row, ok := ctx.Value(jobRowKey{}).(*rivertype.JobRow)
	return row, ok
}
