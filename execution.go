package onceonly

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/exectx"
	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/internal/pgretry"
	"github.com/onceonly/onceonly/keystate"
)

// Func is a handler that may call systems outside Postgres: it runs once
// per (scope, key) as an Execution (see Step and Tx), and its Result is
// stored and replayed like a Handler's. Register it (Engine.Register or
// MiddlewareOptions.Name) so a live engine can finish an execution whose
// process died after a step started.
type Func func(ctx context.Context, x *Execution) (Result, error)

// Fence is the fencing token of an execution: the owner of the key's lease
// and the key's version when the execution took it. A system the handler
// calls can refuse a write carrying an older fence than one it has seen.
type Fence struct {
	Owner   keystate.Owner
	Version int64
}

// Execution is one run of a handler on a key it holds: the first request,
// a retry that took over a dead execution, or the engine's own resumption.
// It is passed in the handler's context (ExecutionOf).
type Execution struct {
	engine  *Engine
	mode    mode
	ref     keystate.Ref
	fence   Fence
	lease   *lease.Lease
	handler string
	request func() []byte
	// fingerprint is the request's, which the key's row is written with.
	fingerprint string
	// claimedAt is when the claim that holds the key was sent; the lease
	// runs from later.
	claimedAt time.Time
	// floor is the version floor a single-commit execution's transaction
	// read on a distributed database (outbox.SingleBegin.Floor), for its
	// row.
	floor int64
	// by says who runs the execution: byFirst, byTakeover or byResumer
	// (the label of onceonly_executions_total).
	by string

	mu       sync.Mutex
	tx       *exectx.Tx                 // set by the first Tx, or by a single commit's claim
	txGiven  bool                       // the handler asked for its transaction (Tx)
	sqlTx    *sql.Tx                    // set by the first SQLTx on Config.DB (sqldb.go)
	stored   bool                       // the request is stored with the key
	outcomes map[string]json.RawMessage // recorded step outcomes
	started  map[string]bool            // steps whose intent is recorded
}

type executionKey struct{}

// ExecutionOf returns the execution running in ctx; ok is false outside a
// handler run by the engine.
func ExecutionOf(ctx context.Context) (x *Execution, ok bool) {
	x, ok = ctx.Value(executionKey{}).(*Execution)
	return x, ok
}

// Scope returns the scope of the key the execution holds.
func (x *Execution) Scope() string { return x.ref.Scope }

// Key returns the idempotency key the execution holds.
func (x *Execution) Key() string { return x.ref.Key }

// Fence returns the execution's fencing token.
func (x *Execution) Fence() Fence { return x.fence }

// Request returns the request the execution runs for: the payload given to
// Run, or the HTTP request as the middleware encodes it.
func (x *Execution) Request() []byte { return x.request() }

// Tx returns the transaction of the execution running in ctx, beginning it
// on first use (READ COMMITTED). The handler writes its business rows
// through it; they commit together with the key's completion, or not at
// all. Steps must come before it.
func Tx(ctx context.Context) (pgx.Tx, error) {
	x, ok := ExecutionOf(ctx)
	if !ok {
		return nil, ErrNoExecution
	}
	return x.Tx(ctx)
}

// Tx returns the execution's transaction. Its BEGIN goes to Postgres with
// its first statement, and its COMMIT with the key's completion.
func (x *Execution) Tx(context.Context) (pgx.Tx, error) {
	x.mu.Lock()
	begun := x.txGiven
	x.mu.Unlock()
	if !begun && !x.lease.Valid() {
		return nil, ErrLeaseLost
	}
	tx, err := x.mode.tx(x)
	if err == nil {
		x.mu.Lock()
		x.txGiven = true
		x.mu.Unlock()
	}
	return tx, err
}

// commitWith sends the statement queue puts on a batch (the key's
// completion, which scans the stored key) and the COMMIT of the
// execution's transaction in one round trip (exectx.Tx.CommitWith).
func (x *Execution) commitWith(ctx context.Context, queue func(b *pgx.Batch, stored *keystate.Key)) (keystate.Key, bool, error) {
	var stored keystate.Key
	if err := x.transaction().CommitWith(ctx, func(b *pgx.Batch) { queue(b, &stored) }); err != nil {
		return keystate.Key{}, false, fromStore(fmt.Errorf("complete and commit: %w", err))
	}
	return stored, true, nil
}

// transaction returns the execution's transaction, made if the handler
// never asked for it.
func (x *Execution) transaction() *exectx.Tx {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tx == nil {
		x.tx = x.engine.newTx(nil)
	}
	return x.tx
}

// DownstreamKey returns the idempotency key a step sends to the system it
// calls: derived from scope, key and step alone, so it is the same on every
// attempt, retry, takeover and process (one external effect). It is 46
// characters of 0x21..0x7E whatever the length of the key.
func DownstreamKey(scope, key, step string) string {
	h := sha256.New()
	for _, part := range []string{scope, key, step} {
		_, _ = fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return "oo_" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// stepRecord is how a step is stored with its key: {} once its intent is
// recorded, {"outcome": …} once its outcome is.
type stepRecord struct {
	Outcome json.RawMessage `json:"outcome,omitempty"`
}

// Step runs call, an effect outside Postgres, once for the execution in
// ctx, as the step named name. call gets the step's downstream idempotency
// key (DownstreamKey) to send along, so the system it calls applies it at
// most once however often it is called.
//
// A step whose outcome an earlier attempt recorded is not called again: its
// outcome is returned. Otherwise Step records the step's intent (durably,
// fenced by the lease owner), calls it, and records its outcome as a
// recovery point. An error from call means the outcome is unknown: the step
// stays unsettled and is called again, with the same key, by the next
// attempt, retry or resumption. T must survive encoding/json.
func Step[T any](ctx context.Context, name string, call func(ctx context.Context, downstreamKey string) (T, error)) (T, error) {
	var zero T
	x, ok := ExecutionOf(ctx)
	if !ok {
		return zero, ErrNoExecution
	}
	if raw, done := x.outcome(name); done {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return zero, fmt.Errorf("step %s: decode recorded outcome: %w", name, err)
		}
		return v, nil
	}
	ctx, span := x.engine.startSpan(ctx, spanStep)
	if span.IsRecording() {
		span.SetAttributes(attrStep.String(name))
	}
	v, err := step(ctx, x, name, call)
	endSpan(span, err)
	return v, err
}

// step records the intent of a step that has no recorded outcome, calls
// out and records the outcome.
func step[T any](ctx context.Context, x *Execution, name string, call func(ctx context.Context, downstreamKey string) (T, error)) (T, error) {
	var zero T
	if err := x.recordIntent(ctx, name); err != nil {
		return zero, err
	}
	v, err := call(ctx, DownstreamKey(x.ref.Scope, x.ref.Key, name))
	if err != nil {
		return zero, fmt.Errorf("step %s: %w", name, err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return zero, fmt.Errorf("step %s: encode outcome: %w", name, err)
	}
	if err := x.recordOutcome(ctx, name, raw); err != nil {
		return zero, err
	}
	return v, nil
}

// outcome returns the recorded outcome of a step.
func (x *Execution) outcome(name string) (json.RawMessage, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	raw, ok := x.outcomes[name]
	return raw, ok
}

// recordIntent records that the step is about to call out, unless an
// earlier attempt did; it refuses when the call must not happen.
func (x *Execution) recordIntent(ctx context.Context, name string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.mode.callerCommits():
		return ErrNoExecution // a step needs a lease, which a caller's transaction has not
	case x.txGiven, x.sqlTx != nil:
		return ErrStepAfterTx
	case x.handler == "":
		return ErrUnnamedHandler
	case !x.lease.Valid():
		return ErrLeaseLost
	}
	if m, ok := x.mode.(*batchMode); ok {
		m.stepped = true // the batch rolls the item back and runs it alone
		return ErrStepInBatch
	}
	if m, ok := x.mode.(singleCommit); ok {
		// The first step of a single-commit execution: its claim commits
		// first, and it goes on two-phase.
		if err := m.promote(ctx, x); err != nil {
			return err
		}
	}
	if !x.started[name] {
		var request []byte
		if !x.stored {
			request = x.request()
		}
		_, err := pgretry.OnLiveConnection(ctx, x.engine.cfg.Pool, func() (struct{}, error) {
			return struct{}{}, x.engine.store.RecordStep(ctx, x.engine.cfg.Pool, x.ref, x.fence.Owner, name, []byte(`{}`), x.handler, request, false)
		})
		if err != nil {
			return fromStore(err)
		}
		x.setStep(name, nil)
		x.stored = true
	}
	if !x.lease.Valid() {
		return ErrLeaseLost
	}
	return nil
}

// recordOutcome records a step's outcome. A failure to record it (other
// than a lost lease) costs only a repeated call with the same downstream
// key later, so the execution goes on with the outcome it has.
func (x *Execution) recordOutcome(ctx context.Context, name string, outcome json.RawMessage) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	record, err := json.Marshal(stepRecord{Outcome: outcome})
	if err != nil {
		return fmt.Errorf("step %s: encode its record: %w", name, err)
	}
	_, err = pgretry.OnLiveConnection(ctx, x.engine.cfg.Pool, func() (struct{}, error) {
		return struct{}{}, x.engine.store.RecordStep(ctx, x.engine.cfg.Pool, x.ref, x.fence.Owner, name, record, x.handler, nil, true)
	})
	if err != nil {
		if err = fromStore(err); errors.Is(err, ErrLeaseLost) {
			return err
		}
		x.engine.log.Warn("record step outcome; a later attempt calls again with the same key",
			"scope", x.ref.Scope, "key", x.ref.Key, "step", name, "err", err)
	}
	x.setStep(name, outcome)
	return nil
}

// loadSteps sets the recovery points an earlier holder recorded.
func (x *Execution) loadSteps(raw []byte) error {
	if len(raw) == 0 {
		return nil
	}
	var steps map[string]stepRecord
	if err := json.Unmarshal(raw, &steps); err != nil {
		return fmt.Errorf("decode recorded steps: %w", err)
	}
	for name, s := range steps {
		x.setStep(name, s.Outcome)
	}
	x.stored = len(steps) > 0
	return nil
}

// setStep records that the step name started and, when outcome is not
// empty, its outcome; x.mu is held.
func (x *Execution) setStep(name string, outcome json.RawMessage) {
	if x.started == nil {
		x.started, x.outcomes = map[string]bool{}, map[string]json.RawMessage{}
	}
	x.started[name] = true
	if len(outcome) > 0 {
		x.outcomes[name] = outcome
	}
}

// unsettled reports whether a step started without a recorded outcome.
func (x *Execution) unsettled() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for name := range x.started {
		if _, ok := x.outcomes[name]; !ok {
			return true
		}
	}
	return false
}

// anyStep reports whether a step started.
func (x *Execution) anyStep() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.started) > 0
}
