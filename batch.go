package onceonly

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/exectx"
	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// MaxBatch is the most deliveries one batch transaction runs: DoBatch
// splits a longer slice. Each delivery runs under a savepoint of its own,
// and a transaction with more than 64 subtransactions that wrote overflows
// Postgres's per-backend subtransaction cache, which slows every other
// session's snapshot checks.
const MaxBatch = 64

// ErrStepInBatch is what Step returns inside a batch (DoBatch): a step
// commits its key's claim and calls a system outside Postgres before the
// final transaction, which a transaction shared with other deliveries
// cannot do without committing their writes early. The engine rolls the
// delivery's writes back to its savepoint, writes nothing for its key, and
// runs it again alone once the batch committed, as Run runs it, where
// Step works. The handler should return the error (any error, or none, is
// treated so once Step refused).
var ErrStepInBatch = errors.New("onceonly: Step inside a batch: the delivery runs again alone")

// ErrHandlerPanicked wraps the panic of a batch delivery's handler: the
// delivery's writes are rolled back and its key failed, and the other
// deliveries of the batch go on.
var ErrHandlerPanicked = errors.New("onceonly: handler panicked")

// errBatchItem is the answer to a BatchItem with neither Tx nor Func.
var errBatchItem = errors.New("onceonly: a BatchItem needs Tx or Func")

// BatchItem is one delivery of a batch (DoBatch): a key, the payload that
// identifies it, and its handler.
type BatchItem struct {
	Scope, Key string
	Payload    []byte
	// Tx writes only to Postgres, through the transaction it is given, as
	// Do's handler does.
	Tx Handler
	// Func runs when Tx is nil: it gets its transaction from its execution
	// (Tx(ctx), Execution.Tx). Step is refused inside the batch
	// (ErrStepInBatch), and the delivery then runs alone.
	Func Func
	// Name is the name Func is registered under (Register): a delivery
	// that runs alone and steps needs it, as Run does. Empty for Tx.
	Name string
}

// BatchResult is the answer to one BatchItem: what Do, or Run, would
// have returned for it.
type BatchResult struct {
	Outcome Outcome
	Err     error
}

// DoBatch runs each item once for its (scope, key), as Do (or Run) runs
// one, and returns their answers in the items' order. The items that
// Redis or Postgres do not answer (a replay, a reused key, a key in
// flight) run in one transaction, up to MaxBatch at a time: their keys'
// locks — the lock every execution of a key takes, of any mode — taken
// together in lock order, each handler under a savepoint of its own (an
// error or a panic rolls back that item's writes alone and fails its
// key), every key's row and outbox event written by one statement, and
// one COMMIT. A key with a row that is neither completed nor another
// payload's (failed, or in progress) runs alone after the batch, as does
// an item whose handler called Step (ErrStepInBatch). An item whose key
// appears earlier in items runs after them, in a later batch, so it is
// answered as the replay (or the reused key) of the first.
//
// A batch that fails as a whole (Postgres ended it at the lease, a handler
// left its connection unusable, its COMMIT failed or its outcome is
// unknown) runs each of its items again alone, so one item cannot sink the
// others; when ctx ended, they are answered its error instead.
// With Config.TwoPhase, Config.DB or a distributed database, the items run
// one after the other, each as Do or Run runs it.
func (e *Engine) DoBatch(ctx context.Context, items []BatchItem) []BatchResult {
	results := make([]BatchResult, len(items))
	if err := e.made(); err != nil {
		for i := range results {
			results[i].Err = err
		}
		return results
	}
	if _, single := e.modeFor().(singleCommit); !single || len(items) == 1 || e.store.CanBatch() != nil {
		for i, it := range items {
			results[i] = e.runAlone(ctx, it)
		}
		return results
	}
	var (
		todo  []*batchEntry
		later []int // items whose key an earlier item has
		seen  = make(map[keystate.Ref]bool, len(items))
	)
	for i, it := range items {
		ref := keystate.Ref{Scope: it.Scope, Key: it.Key}
		switch {
		case it.Tx == nil && it.Func == nil:
			results[i].Err = errBatchItem
			continue
		case seen[ref]:
			later = append(later, i)
			continue
		}
		en := &batchEntry{i: i, item: it, ref: ref, fp: payloadFingerprint(it.Payload)}
		var err error
		if _, en.call, err = e.enter(ctx, it.Scope, it.Key, it.Name, false); err != nil {
			e.leave(en.call, outcomeInvalid, false, err)
			results[i].Err = err
			continue
		}
		seen[ref] = true
		todo = append(todo, en)
	}
	for len(todo) > 0 {
		n := min(len(todo), MaxBatch)
		e.runBatch(ctx, todo[:n], results)
		todo = todo[n:]
	}
	if len(later) > 0 {
		again := make([]BatchItem, len(later))
		for j, i := range later {
			again[j] = items[i]
		}
		for j, r := range e.DoBatch(ctx, again) {
			results[later[j]] = r
		}
	}
	return results
}

// runAlone runs one item as Do or Run runs it.
func (e *Engine) runAlone(ctx context.Context, it BatchItem) BatchResult {
	fn := it.Func
	switch {
	case it.Tx != nil:
		fn = withTx(it.Tx)
	case fn == nil:
		return BatchResult{Err: errBatchItem}
	}
	payload := it.Payload
	out, err := e.execute(ctx, e.modeFor(), it.Scope, it.Key, fingerprint{value: payloadFingerprint(payload)}, it.Name, func() []byte { return payload }, fn)
	return BatchResult{Outcome: out, Err: err}
}

// A batchEntry is one item of a batch, from its entry on.
type batchEntry struct {
	i    int // the item's index in DoBatch's items
	item BatchItem
	ref  keystate.Ref
	fp   string
	call entryCall
	// The item's end in the batch's transaction, once its handler ran.
	end     outbox.BatchEnd
	ended   bool
	outcome string
	result  BatchResult
}

// answer sets en's answer and ends its call.
func (e *Engine) answer(en *batchEntry, results []BatchResult, outcome string, out Outcome, err error) {
	results[en.i] = BatchResult{Outcome: out, Err: err}
	e.leave(en.call, outcome, out.Replayed, err)
}

// runBatch runs entries (distinct keys, at most MaxBatch) as one batch.
func (e *Engine) runBatch(ctx context.Context, entries []*batchEntry, results []BatchResult) {
	entries = e.answerFromCache(ctx, entries, results)
	if len(entries) == 0 {
		return
	}
	var alone []*batchEntry
	defer func() {
		for _, en := range alone {
			e.leave(en.call, outcomeAskedAgain, false, nil)
			results[en.i] = e.runAlone(ctx, en.item)
		}
	}()
	fail := func(entries []*batchEntry, err error) {
		err = unavailable(err)
		for _, en := range entries {
			e.answer(en, results, outcomeUnavailable, Outcome{}, err)
		}
	}
	if err := e.store.LoadLockSecret(ctx, e.cfg.Pool); err != nil {
		fail(entries, fromStore(err))
		return
	}
	refs := make([]keystate.Ref, len(entries))
	byRef := make(map[keystate.Ref]*batchEntry, len(entries))
	for i, en := range entries {
		refs[i], byRef[en.ref] = en.ref, en
	}
	e.store.SortByLock(refs)
	for i, r := range refs {
		entries[i] = byRef[r]
	}

	var opened outbox.BatchOpen
	tx := e.newTx(e.store.PrepareSession)
	if err := tx.BeginWith(ctx, func(b *pgx.Batch) { e.store.QueueBatchBegin(b, refs, e.cfg.LeaseTimeout, &opened) }); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		fail(entries, fromStore(fmt.Errorf("begin batch: %w", err)))
		return
	}
	var run []*batchEntry
	for i, en := range entries {
		k, hasRow := opened.Rows[en.ref]
		switch {
		case i >= len(opened.Locked) || !opened.Locked[i]:
			e.answer(en, results, outcomeInFlight, Outcome{}, inFlight(e.cfg.LeaseTimeout))
		case hasRow && (k.Status == keystate.Completed || k.Fingerprint != en.fp):
			out, outcome, err := e.answerHeld(k, en.fp)
			e.answer(en, results, outcome, out, err)
		case hasRow:
			alone = append(alone, en) // failed or in progress: the two-phase way
		default:
			run = append(run, en)
		}
	}
	var ends []outbox.BatchEnd
	for _, en := range run {
		stepped, err := e.runEntry(ctx, tx, en)
		switch {
		case err != nil:
			_ = tx.Rollback(context.WithoutCancel(ctx))
			e.log.Warn("batch failed; its deliveries run alone", "err", err)
			alone = aloneAfter(ctx, alone, run, fail, err)
			return
		case stepped:
			alone = append(alone, en)
		default:
			ends = append(ends, en.end)
		}
	}
	if len(ends) == 0 {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return
	}
	stored := make(map[keystate.Ref]keystate.Key, len(ends))
	if err := tx.CommitWith(ctx, func(b *pgx.Batch) { e.store.QueueBatchFinish(b, ends, stored) }); err != nil {
		var done []*batchEntry
		for _, en := range run {
			if en.ended {
				done = append(done, en)
			}
		}
		// Whether the COMMIT landed is unknown: alone, each delivery takes
		// its key's lock again and finds its row if it did (a replay).
		err = fromStore(fmt.Errorf("finish batch and commit: %w", err))
		e.log.Warn("batch commit failed; its deliveries run alone", "err", err)
		alone = aloneAfter(ctx, alone, done, fail, err)
		return
	}
	keys := make([]keystate.Key, 0, len(stored))
	for _, en := range run {
		if !en.ended {
			continue
		}
		k := stored[en.ref]
		keys = append(keys, k)
		if ee, ok := errors.AsType[*ExecutionError](en.result.Err); ok {
			ee.Failures = k.Failures
		}
		results[en.i] = en.result
		e.leave(en.call, en.outcome, false, en.result.Err)
		e.metrics.executions.WithLabelValues(byFirst, en.outcome).Inc()
	}
	e.writeThroughAll(ctx, keys)
}

// aloneAfter returns alone with ens added, to run alone once a batch
// failed as a whole (err): a delivery whose handler broke the batch's
// transaction (a connection left busy, a statement that killed it) fails
// itself alone, not its batch's others again and again. When the caller
// left, ens are answered err instead (fail).
func aloneAfter(ctx context.Context, alone, ens []*batchEntry, fail func([]*batchEntry, error), err error) []*batchEntry {
	if ctx.Err() != nil {
		fail(ens, err)
		return slices.DeleteFunc(alone, func(en *batchEntry) bool { return slices.Contains(ens, en) })
	}
	for _, en := range ens {
		if !slices.Contains(alone, en) {
			alone = append(alone, en)
		}
	}
	return alone
}

// answerFromCache answers the entries Redis can answer (replays, reused
// keys, keys in flight), with one pipeline for all, and returns the
// others. Without Redis, or when it fails, Postgres answers them all.
func (e *Engine) answerFromCache(ctx context.Context, entries []*batchEntry, results []BatchResult) []*batchEntry {
	if e.cache == nil {
		return entries
	}
	refs, fps := make([]keystate.Ref, len(entries)), make([]string, len(entries))
	for i, en := range entries {
		refs[i], fps[i] = en.ref, en.fp
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.RedisTimeout)
	verdicts, err := e.cache.PeekBatch(rctx, refs, fps)
	cancel()
	if err != nil {
		e.redisFailed(redisOpCheck, err)
		return entries
	}
	rest := entries[:0:0]
	for i, en := range entries {
		out, outcome, done, err := answerCached(verdicts[i])
		if !done {
			rest = append(rest, en)
			continue
		}
		e.answer(en, results, outcome, out, err)
	}
	return rest
}

// writeThroughAll copies the batch's committed keys into Redis in one
// pipeline, best effort; what did not land wakes the relays, unless the
// transaction notified them already.
func (e *Engine) writeThroughAll(ctx context.Context, keys []keystate.Key) {
	if e.cache != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RedisTimeout)
		res, err := e.cache.ApplyBatch(actx, keys)
		cancel()
		if err == nil && !slices.ContainsFunc(res, func(r cache.ApplyResult) bool { return r.Err != nil }) {
			return
		}
		if err != nil {
			e.redisFailed(redisOpApply, err)
		}
	}
	if !e.cfg.Tuning.NotifyInTransaction {
		e.wake.Kick()
	}
}

// runEntry runs en's handler under a savepoint of tx and sets en's end.
// stepped is true when the handler called Step (refused: en runs alone);
// its writes are rolled back. An error is the batch's transaction's: no
// item of it can commit.
func (e *Engine) runEntry(ctx context.Context, tx *exectx.Tx, en *batchEntry) (stepped bool, err error) {
	ctx = trace.ContextWithSpan(ctx, en.call.span) // the item's own span (enter)
	sp := &itemTx{batch: tx, name: itemSavepoint}
	payload := en.item.Payload
	bm := &batchMode{e: e, sp: sp}
	x := e.newExecution(bm, en.ref, e.owners.Next(), en.item.Name, func() []byte { return payload })
	x.fingerprint = en.fp
	fn := en.item.Func
	if en.item.Tx != nil {
		fn = withTx(en.item.Tx)
	}
	hctx := context.WithValue(ctx, executionKey{}, x)
	sctx, span := e.startSpan(hctx, spanHandler)
	res, handleErr, panicked := e.callInBatch(sctx, x, fn)
	endSpan(span, handleErr)
	if res.Status == 0 {
		res.Status = http.StatusOK
	}
	if handleErr == nil && !bm.stepped && aborted(tx) {
		// A statement failed and the handler went on: its writes cannot
		// commit, and would take the batch's others down with them.
		handleErr = errAborted
	}
	stored := handleErr == nil && !bm.stepped && e.cfg.ShouldStore(res.Status)
	if !stored {
		if err := sp.rollBack(context.WithoutCancel(ctx)); err != nil {
			return false, err
		}
	}
	if bm.stepped {
		return true, nil
	}
	en.ended = true
	en.end = outbox.BatchEnd{Ref: en.ref, Fingerprint: en.fp, Completed: stored, Response: keystate.Response(res)}
	switch {
	case stored:
		en.outcome, en.result = outcomeExecuted, BatchResult{Outcome: Outcome{Result: res}}
	case panicked:
		en.end.CountFailure = true
		en.outcome, en.result = outcomePanic, BatchResult{Err: &ExecutionError{Err: handleErr}}
	case handleErr == nil:
		en.end.CountFailure = true // a deliberate answer that is not stored
		en.outcome, en.result = outcomeFailed, BatchResult{Outcome: Outcome{Result: res}}
	default:
		en.end.CountFailure = ctx.Err() == nil // a caller that left is not the handler's failure
		en.outcome, en.result = outcomeHandlerError, BatchResult{Err: &ExecutionError{Err: handleErr}}
	}
	return false, nil
}

// errAborted is the error of a batch item whose handler returned no error
// from a transaction a failed statement had aborted.
var errAborted = errors.New("onceonly: a statement of the handler failed and its transaction is aborted")

// aborted reports whether tx is in a failed transaction block: a statement
// failed since its last savepoint was rolled back to.
func aborted(tx *exectx.Tx) bool {
	conn := tx.Conn()
	return conn != nil && conn.PgConn().TxStatus() == 'E'
}

// callInBatch runs fn; a panic becomes its error (ErrHandlerPanicked), so
// the other items of the batch go on.
func (e *Engine) callInBatch(ctx context.Context, x *Execution, fn Func) (res Result, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			e.log.ErrorContext(ctx, "batch handler panicked", "scope", x.ref.Scope, "key", x.ref.Key, "panic", p, "stack", string(debug.Stack()))
			res, err, panicked = Result{}, fmt.Errorf("%w: %v", ErrHandlerPanicked, p), true
		}
	}()
	res, err = fn(ctx, x)
	return res, err, false
}

// itemSavepoint names every item's savepoint: items run one after the
// other, and a savepoint shadows an older one of the same name, so the
// latest — the item's own — is the one ROLLBACK TO finds. One name is one
// statement for the connection's statement cache, not one per item.
const itemSavepoint = "onceonly_item"

// itemTx is the transaction a batch item's handler writes through: its
// savepoint in the batch's transaction, made with the handler's first
// statement — an Exec carries it in the same round trip — so an item that
// writes one row costs one round trip, and one that writes nothing none.
// The engine ends it: Commit and Rollback refuse (ErrCommitByHandler); a
// handler's own savepoints (Begin) are its to end.
type itemTx struct {
	batch *exectx.Tx
	name  string // the savepoint's
	made  bool
}

// make makes the savepoint, unless the handler's first statement did.
func (t *itemTx) make(ctx context.Context) error {
	if t.made {
		return nil
	}
	if _, err := t.batch.Exec(ctx, "SAVEPOINT "+t.name); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	t.made = true
	return nil
}

// rollBack rolls the item's writes back to its savepoint, if it made one.
func (t *itemTx) rollBack(ctx context.Context) error {
	if !t.made {
		return nil
	}
	if _, err := t.batch.Exec(ctx, "ROLLBACK TO SAVEPOINT "+t.name); err != nil {
		return fmt.Errorf("roll back to the savepoint: %w", err)
	}
	return nil
}

// Exec runs sql in the item's savepoint; the first sends the savepoint
// with it.
func (t *itemTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.made {
		return t.batch.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + t.name)
	b.Queue(sql, args...)
	br := t.batch.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("savepoint: %w", err)
	}
	t.made = true
	return br.Exec() //nolint:wrapcheck // the handler's own statement: its error as pgx returns it, as outside a batch
}

// Query runs sql in the item's savepoint.
func (t *itemTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.make(ctx); err != nil {
		return nil, err
	}
	return t.batch.Query(ctx, sql, args...)
}

// QueryRow runs sql in the item's savepoint.
func (t *itemTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.make(ctx); err != nil {
		return errRow{err}
	}
	return t.batch.QueryRow(ctx, sql, args...)
}

// SendBatch sends b in the item's savepoint.
func (t *itemTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.make(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.batch.SendBatch(ctx, b)
}

// Begin starts a pseudo nested transaction inside the item's savepoint.
func (t *itemTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.make(ctx); err != nil {
		return nil, err
	}
	return t.batch.Begin(ctx)
}

// CopyFrom copies rows into tableName in the item's savepoint.
func (t *itemTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := t.make(ctx); err != nil {
		return 0, err
	}
	return t.batch.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Prepare prepares a statement on the batch's connection.
func (t *itemTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.batch.Prepare(ctx, name, sql)
}

// LargeObjects returns the large objects of the item's savepoint; a
// savepoint that cannot be made leaves them unusable, as exectx.Tx's.
func (t *itemTx) LargeObjects() pgx.LargeObjects {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := t.make(ctx); err != nil {
		return pgx.LargeObjects{}
	}
	return t.batch.LargeObjects()
}

// Conn returns the batch's connection.
func (t *itemTx) Conn() *pgx.Conn { return t.batch.Conn() }

// Commit refuses: the engine commits the batch.
func (*itemTx) Commit(context.Context) error { return ErrCommitByHandler }

// Rollback refuses: the engine rolls an item back, to its savepoint, when
// its handler returns an error.
func (*itemTx) Rollback(context.Context) error { return ErrCommitByHandler }

// errRow is a pgx.Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// batchMode is the mode of one item of a batch (DoBatch): the batch's
// transaction holds the key's lock, and its statements write the key's
// row; the execution only gives its handler the item's savepoint, and
// refuses steps (ErrStepInBatch). The rest of the flow is the batch's.
type batchMode struct {
	e       *Engine
	sp      *itemTx
	stepped bool // Step was refused: the item runs alone
}

func (*batchMode) check(context.Context, keystate.Ref, string, keystate.Owner) (Outcome, string, bool, error) {
	return Outcome{}, "", false, nil
}

func (*batchMode) claim(context.Context, *Execution) (keystate.Key, bool, error) {
	return keystate.Key{}, false, errors.New("onceonly: a batch item is claimed by its batch")
}

// hold returns no lease: the batch's transaction holds the key, bounded by
// the lease in Postgres.
func (*batchMode) hold(context.Context, *Execution, func()) *lease.Lease { return nil }

func (m *batchMode) tx(*Execution) (pgx.Tx, error) { return m.sp, nil }

func (*batchMode) sqlTx(context.Context, *Execution) (*sql.Tx, error) { return nil, ErrTxKind }

func (*batchMode) complete(context.Context, *Execution, Result) (keystate.Key, bool, error) {
	return keystate.Key{}, false, errors.New("onceonly: a batch item is completed by its batch")
}

func (*batchMode) release(context.Context, *Execution, ending) (keystate.Key, bool, error) {
	return keystate.Key{}, false, nil
}

func (*batchMode) keepsRow() bool      { return false }
func (*batchMode) callerCommits() bool { return false }
