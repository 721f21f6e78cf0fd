package onceriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/internal/canonjson"
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
// completes the job; an error is returned to River as it is (River retries
// it with its backoff, or cancels or snoozes it if the error says so).
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
}

// Worker is a river.Worker[T] that runs its handler once per logical
// message (scope, key) however often River runs the job, and however many
// jobs carry the message. Add it with river.AddWorker.
//
// What each attempt of a job turns into:
//
//   - first run: the handler runs; its writes, the key's completion and the
//     job's completion (river.JobCompleteTx) commit in one transaction;
//   - the key is completed already (a duplicate job, or a run after a
//     resumption finished the message): the handler does not run and the
//     job completes;
//   - the key is held by a live execution (*onceonly.InFlightError): the job
//     is snoozed (river.JobSnooze), which does not use up an attempt, for
//     the error's RetryAfter capped at maxSnooze: RetryAfter is the rest of
//     the holder's lease, the worst case, while a live holder usually
//     finishes in milliseconds;
//   - the key was used with other args (onceonly.ErrKeyReused), or the key
//     or scope is invalid: the job is cancelled (river.JobCancel); retrying
//     cannot help;
//   - Postgres unreachable (onceonly.ErrUnavailable), a lost lease, or the
//     handler's own error: the error goes back to River, which retries.
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
	return &Worker[T]{engine: engine, scope: scope, key: key, timeout: opts.Timeout, log: log}, nil
}

// kindOf returns the job kind of T.
func kindOf[T river.JobArgs]() string {
	var zero T
	return zero.Kind()
}

// Timeout implements river.Worker: Options.Timeout.
func (w *Worker[T]) Timeout(*river.Job[T]) time.Duration { return w.timeout }

// minSnooze and maxSnooze bound the snooze of a job whose key is in flight.
const (
	minSnooze = 100 * time.Millisecond
	maxSnooze = time.Second
)

// Work implements river.Worker.
func (w *Worker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	key := w.key(job.Args)
	payload := canonicalArgs(job.EncodedArgs)
	ctx = context.WithValue(ctx, jobKey{}, job)
	ctx = context.WithValue(ctx, jobRowKey{}, job.JobRow)
	var err error
	if w.txHandler != nil {
		_, err = w.engine.Do(ctx, w.scope, key, payload, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			if err := w.txHandler(ctx, tx, job); err != nil {
				return onceonly.Result{}, &handlerError{err: err}
			}
			return onceonly.Result{Status: 200}, w.completeJob(ctx, tx, job)
		})
	} else {
		_, err = w.engine.Run(ctx, w.name, w.scope, key, payload)
	}
	return w.verdict(job.JobRow, key, err)
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

// verdict turns the engine's answer into what River does with the job.
func (w *Worker[T]) verdict(job *rivertype.JobRow, key string, err error) error {
	if err == nil {
		return nil
	}
	if he, ok := errors.AsType[*handlerError](err); ok {
		return he.err
	}
	if inFlight, ok := onceonly.IsInFlight(err); ok {
		return river.JobSnooze(min(max(inFlight.RetryAfter, minSnooze), maxSnooze)) //nolint:wrapcheck // River reads the snooze by its type; it is the job's verdict, not a failure
	}
	err = fmt.Errorf("onceriver: job %d (%s), key %q: %w", job.ID, job.Kind, key, err)
	if errors.Is(err, onceonly.ErrKeyReused) || errors.Is(err, onceonly.ErrInvalidKey) || errors.Is(err, onceonly.ErrInvalidScope) {
		return river.JobCancel(err) //nolint:wrapcheck // River reads the cancellation by its type; err inside carries the context
	}
	return err
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
	if c, err := canonjson.Canonical(encoded); err == nil {
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
