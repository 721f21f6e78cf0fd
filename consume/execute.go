package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
)

// Handler is a broker package's Handler as the Executor calls it: m is the
// message being handled, the zero M when Engine.Resume finishes the key
// after the process running it died.
type Handler[M any] func(ctx context.Context, id Identity, m M) error

// TxHandler is a broker package's TxHandler as the Executor calls it.
type TxHandler[M any] func(ctx context.Context, tx pgx.Tx, id Identity, m M) error

// Config configures an Executor.
type Config[M any] struct {
	// Package names the broker package in errors and logs ("onceamqp").
	Package string
	// Engine runs the executions.
	Engine *onceonly.Engine
	// Identifier identifies each message.
	Identifier Identifier[M]
	// Policy turns the engine's answers into settlements.
	Policy onceonly.SettlePolicy
	// Logger receives the logs of panics.
	Logger *slog.Logger
	// Attrs returns the log attributes that name a message (its id, its
	// sequence); nil: none.
	Attrs func(m M) []any
}

// Executor turns a broker message into a Settlement: it identifies the
// message, executes it once through the engine, and settles the answer by
// the policy. Create it with New; it is safe for concurrent use.
type Executor[M any] struct {
	cfg     Config[M]
	name    string // registered name; "" for a TxHandler
	handler Handler[M]
	tx      TxHandler[M]
}

// Work is what an Executor runs for each message: Handler, through
// Engine.Run, or Tx, through Engine.Do.
type Work[M any] struct {
	// Handler may call systems outside Postgres; it is registered with the
	// engine so that Engine.Resume can finish an execution whose process
	// died after a step started.
	Handler Handler[M]
	// Tx only writes to Postgres, in the key's transaction.
	Tx TxHandler[M]
}

// New returns an executor running w. A Handler is registered with the
// engine under name, the same in every process consuming the messages.
func New[M any](cfg Config[M], name string, w Work[M]) (*Executor[M], error) {
	e := &Executor[M]{cfg: cfg, handler: w.Handler, tx: w.Tx}
	if w.Handler == nil {
		return e, nil
	}
	e.name = name
	if err := cfg.Engine.Register(name, e.execute); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Package, err)
	}
	return e, nil
}

// Settle runs m through the engine, unless it is invalid, and returns its
// settlement.
func (e *Executor[M]) Settle(ctx context.Context, m M) onceonly.Settlement {
	id, err := e.cfg.Identifier.Identify(m)
	if err != nil {
		return e.invalid(ctx, m, err)
	}
	var out onceonly.Outcome
	if e.tx != nil {
		out, err = e.cfg.Engine.Do(ctx, id.Scope, id.Key, id.Payload, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			return e.call(ctx, id, func() error { return e.tx(ctx, tx, id, m) })
		})
	} else {
		out, err = e.cfg.Engine.Run(context.WithValue(ctx, messageKey[M]{}, m), e.name, id.Scope, id.Key, id.Payload)
	}
	return e.cfg.Policy.Settle(out, err)
}

// SettleBatch runs ms through the engine as one batch (Engine.DoBatch:
// one transaction, one commit, each message under a savepoint of its own)
// and returns their settlements in ms's order. An invalid message is
// settled without running. A Handler that calls Step inside the batch is
// refused (onceonly.ErrStepInBatch) and its message runs again alone, as
// Settle runs it; so is a message whose key has a failed or in-progress
// row. Settle each message only after SettleBatch returned: the batch's
// commit came first.
func (e *Executor[M]) SettleBatch(ctx context.Context, ms []M) []onceonly.Settlement {
	settled := make([]onceonly.Settlement, len(ms))
	items := make([]onceonly.BatchItem, 0, len(ms))
	at := make([]int, 0, len(ms)) // the index in ms of each item
	for i, m := range ms {
		id, err := e.cfg.Identifier.Identify(m)
		if err != nil {
			settled[i] = e.invalid(ctx, m, err)
			continue
		}
		items = append(items, e.item(id, m))
		at = append(at, i)
	}
	for j, r := range e.cfg.Engine.DoBatch(ctx, items) {
		settled[at[j]] = e.cfg.Policy.Settle(r.Outcome, r.Err)
	}
	return settled
}

// item is the batch item of m, identified as id.
func (e *Executor[M]) item(id Identity, m M) onceonly.BatchItem {
	it := onceonly.BatchItem{Scope: id.Scope, Key: id.Key, Payload: id.Payload}
	if e.tx != nil {
		it.Tx = func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			return e.call(ctx, id, func() error { return e.tx(ctx, tx, id, m) })
		}
		return it
	}
	it.Name = e.name
	it.Func = func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		return e.call(ctx, id, func() error { return e.handler(ctx, id, m) })
	}
	return it
}

// invalid settles m, which could not be identified (err).
func (e *Executor[M]) invalid(ctx context.Context, m M, err error) onceonly.Settlement {
	if p, ok := errors.AsType[*PanicError](err); ok {
		e.cfg.Logger.ErrorContext(ctx, e.cfg.Package+": Options.Key, ScopeOf or Payload panicked", append(e.attrs(m), "panic", p.Value)...)
	}
	return e.cfg.Policy.Settle(onceonly.Outcome{}, err)
}

// messageKey carries the message from Settle to execute through Engine.Run.
type messageKey[M any] struct{}

// execute is the registered onceonly.Func of a Handler. In a resumption
// there is no message: the handler runs on the stored payload alone.
func (e *Executor[M]) execute(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	id := Identity{Scope: x.Scope(), Key: x.Key(), Payload: x.Request()}
	m, _ := ctx.Value(messageKey[M]{}).(M)
	return e.call(ctx, id, func() error { return e.handler(ctx, id, m) })
}

// call runs a handler: nil is a stored result (200). A panic becomes the
// execution's error, so the key fails and the message comes back, as
// after any failure, and is dead-lettered after SettlePolicy.MaxFailures:
// a handler that panics on one message never takes the process down again
// and again.
func (e *Executor[M]) call(ctx context.Context, id Identity, fn func() error) (res onceonly.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			e.cfg.Logger.ErrorContext(ctx, e.cfg.Package+": handler panicked", "scope", id.Scope, "key", id.Key, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("%s: handler panicked: %v", e.cfg.Package, p)
		}
	}()
	if err := fn(); err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: 200}, nil
}

func (e *Executor[M]) attrs(m M) []any {
	if e.cfg.Attrs == nil {
		return nil
	}
	return e.cfg.Attrs(m)
}
