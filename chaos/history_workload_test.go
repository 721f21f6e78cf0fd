package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for DoSQLTx and Config.DB
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// The history test's workload: the callers, the handlers they run and
// what both record. Everything is recorded in Postgres, through a pool of
// its own whose statements autocommit (never in an execution's
// transaction), so worker processes record the same way as the test's own
// process and the checker reads one history.

// historySchema holds the history: one row per handler run (its start
// taken as the handler is entered, before its record waits for a
// connection, and when the record was written; the version of the claim
// it runs under, 0 for a one-commit execution's lock, at its start and at
// its end; its end written when the handler returns), one
// business row per handler that got as far as its write, through the
// execution's transaction (deliberately not unique on (scope, key): a
// second row is what the checker counts), and one row per call a caller
// made, with what it was told; and the stalls of the processes (see
// watchStalls).
const historySchema = `
CREATE TABLE history_runs (
	run_id     text PRIMARY KEY,
	attempt_id text NOT NULL,
	worker     text NOT NULL,
	scope      text NOT NULL,
	key        text NOT NULL,
	mode       text NOT NULL,
	payload    text NOT NULL,
	version    bigint NOT NULL,
	started_at timestamptz NOT NULL,
	recorded_at timestamptz NOT NULL,
	ended_at   timestamptz,
	end_version bigint,
	result     text
);
CREATE TABLE history_effects (
	scope  text NOT NULL,
	key    text NOT NULL,
	run_id text NOT NULL
);
CREATE TABLE history_stalls (
	worker    text NOT NULL,
	from_at   timestamptz NOT NULL,
	to_at     timestamptz NOT NULL
);
CREATE TABLE history_calls (
	attempt_id text PRIMARY KEY,
	worker     text NOT NULL,
	scope      text NOT NULL,
	key        text NOT NULL,
	entry      text NOT NULL,
	payload    text NOT NULL,
	started_at timestamptz NOT NULL,
	ended_at   timestamptz NOT NULL,
	told       text NOT NULL,
	run_id     text NOT NULL,
	detail     text NOT NULL
);`

// The entry points the callers mix on the same keys. Each is one way into
// the engine; its name is the mode the handler's run is recorded with.
const (
	entryDo1      = "do"           // Engine.Do, one-commit engine
	entryDo2      = "do-2phase"    // Engine.Do, Config.TwoPhase
	entryRun      = "run"          // Engine.Run, a registered Func without a step (one commit)
	entryRunStep  = "run-step"     // Engine.Run, a Func with a Step (one commit promoted to two-phase)
	entryHTTP     = "http"         // the net/http middleware of the one-commit engine
	entryDoTx     = "dotx"         // Engine.DoTx in the caller's pgx transaction
	entryDoSQLTx  = "dosqltx"      // Engine.DoSQLTx in the caller's database/sql transaction
	entryDoSQL    = "dosql-db"     // Engine.DoSQL on an engine with Config.DB (two-phase)
	entryConsumer = "consumer"     // Engine.Do (one commit) redelivered as Settle says
	modeResume    = "resume"       // a run the resumer started: no caller
	stepFuncName  = "history-step" // the registered Func that steps
	plainFuncName = "history-plain"
)

// historyEntries are the entry points, each drawn as often as the others
// in a mixed burst; oneCommitEntries those of a one-commit storm.
var (
	historyEntries   = []string{entryDo1, entryDo2, entryRun, entryRunStep, entryHTTP, entryDoTx, entryDoSQLTx, entryDoSQL, entryConsumer}
	oneCommitEntries = []string{entryDo1, entryRun, entryRunStep, entryHTTP, entryConsumer}
)

// rowSuffix marks the mode of a run of a one-commit entry point that
// claimed its key two-phase (the key had a row), so holds it by a row.
const rowSuffix = "~row"

// oneCommitModes are the modes whose executions hold their key by the
// one-commit transaction's advisory lock (a run-step until its step).
var oneCommitModes = map[string]bool{entryDo1: true, entryRun: true, entryRunStep: true, entryHTTP: true, entryConsumer: true}

// callerTxModes are the modes whose failed executions leave no row: the
// caller's transaction rolls back to its savepoint.
var callerTxModes = map[string]bool{entryDoTx: true, entryDoSQLTx: true}

// What a caller is told, as recorded in history_calls.told.
const (
	toldOK          = "ok"           // a fresh stored result
	toldReplayed    = "replayed"     // a stored result replayed
	toldInFlight    = "in_flight"    // *InFlightError, or a 409 "in progress"
	toldLost        = "lost"         // ErrLeaseLost, or the middleware's 409 "took this key over"
	toldFailed      = "failed"       // *ExecutionError, or a result that is not stored (500)
	toldPanic       = "panic"        // the handler's panic came up (a broken connection over HTTP)
	toldReused      = "reused"       // ErrKeyReused, 422
	toldUnavailable = "unavailable"  // ErrUnavailable, 503
	toldCommitErr   = "commit_error" // the caller's own commit failed (DoTx, DoSQLTx)
	toldDeadLetter  = "dead_letter"  // Settle dead-lettered the delivery
	toldOther       = "other"
)

// Behaviours of a handler run, drawn per attempt.
type behaviour struct {
	// Outcome is ok (a stored 201 or 402), fail (an error), status500 (a
	// result that is not stored) or panic.
	Outcome string
	// Sleep is how long the handler sleeps, honouring its context, before
	// (or, with SleepAfterWrite, after) its business write; some sleeps
	// outlast the lease.
	Sleep           time.Duration
	SleepAfterWrite bool
}

// attempt is one call a caller makes: its key, entry point, payload and
// the behaviour its handler run (if any) gets.
type attempt struct {
	id, scope, key, entry, payload string
	behave                         behaviour
}

type attemptKey struct{}

// attemptOf returns the attempt whose call runs in ctx (nil in a run the
// resumer started).
func attemptOf(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// harnessConfig is what one process of the workload needs: the test's
// database, Redis (behind the fault proxy) and the shared parameters.
type harnessConfig struct {
	DatabaseURL string        `json:"database_url"`
	RedisURL    string        `json:"redis_url"`
	RedisPrefix string        `json:"redis_prefix"`
	Worker      string        `json:"worker"` // the process's tag in the history
	Seed        uint64        `json:"seed"`
	Stream      uint64        `json:"stream"` // this process's random stream (of Seed)
	Lease       time.Duration `json:"lease"`
	Start       time.Time     `json:"start"` // the run's start, which key generations count from
	Until       time.Time     `json:"until"` // no burst starts after it
	Bursts      int           `json:"bursts"`
	Slots       int           `json:"slots"`
	// PoolConns bounds each pool the process opens.
	PoolConns int32 `json:"pool_conns"`
}

// historyScopes are the two scopes of the key space.
var historyScopes = []string{"alpha", "beta"}

// keyPeriod is how long a key slot keeps one key before the next
// generation replaces it: slots are reused so the key space stays small,
// and keys are renewed so there are always fresh keys to race on.
const keyPeriod = 3 * time.Second

// harness is one process's engines, entry points and recorders.
type harness struct {
	cfg     harnessConfig
	history *pgxpool.Pool // autocommitted history writes
	callers *pgxpool.Pool // the callers' own transactions (DoTx)
	sqlDB   *sql.DB       // the callers' database/sql transactions (DoSQLTx)
	engDB   *sql.DB       // Config.DB of the database/sql engine
	rdb     *redis.Client

	oneCommit, twoPhase, withDB *onceonly.Engine
	pools                       []*pgxpool.Pool
	srv                         *httptest.Server
	client                      *http.Client

	closeOnce sync.Once
	stopWatch context.CancelFunc
	watching  sync.WaitGroup
	ids       atomic.Int64
	attempts  sync.Map // attempt id → *attempt, for the HTTP handler
	errs      struct {
		sync.Mutex
		n     int
		first []string
	}
}

// newHarness opens the pools, builds the three engines (one commit, two
// phase, database/sql) with their daemons started, and the middleware's
// server.
func newHarness(ctx context.Context, cfg harnessConfig) (*harness, error) {
	h := &harness{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			h.close()
		}
	}()
	var err error
	if h.history, err = h.pool(ctx, cfg.PoolConns); err != nil {
		return nil, err
	}
	if h.callers, err = h.pool(ctx, cfg.PoolConns); err != nil {
		return nil, err
	}
	if h.sqlDB, err = sql.Open("pgx", cfg.DatabaseURL); err != nil {
		return nil, err
	}
	h.sqlDB.SetMaxOpenConns(int(cfg.PoolConns))
	if h.engDB, err = sql.Open("pgx", cfg.DatabaseURL); err != nil {
		return nil, err
	}
	h.engDB.SetMaxOpenConns(int(cfg.PoolConns))
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	// No retry inside go-redis: a caller that retries at once on 409 then
	// asks Postgres at once while Redis is down, as one on a service
	// without Redis would.
	opts.DialTimeout, opts.MaxRetries = 200*time.Millisecond, -1
	h.rdb = redis.NewClient(opts)
	mk := func(twoPhase bool, db *sql.DB) (*onceonly.Engine, error) {
		pool, err := h.pool(ctx, cfg.PoolConns)
		if err != nil {
			return nil, err
		}
		e, err := onceonly.New(onceonly.Config{
			Pool: pool, DB: db, Redis: h.rdb, RedisPrefix: cfg.RedisPrefix, TwoPhase: twoPhase,
			LeaseTimeout: cfg.Lease, FailedTTL: time.Hour, ResumeInterval: 300 * time.Millisecond,
			Logger: oncetest.QuietLogger(),
			Daemons: onceonly.Daemons{ReconcileSchedule: "@every 1s", ReapGrace: 100 * time.Millisecond,
				PollInterval: 200 * time.Millisecond},
		})
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	if h.oneCommit, err = mk(false, nil); err != nil {
		return nil, err
	}
	if h.twoPhase, err = mk(true, nil); err != nil {
		return nil, err
	}
	if h.withDB, err = mk(false, h.engDB); err != nil {
		return nil, err
	}
	// The same Funcs on the engines that run them, so either resumer may
	// finish a handed-off execution.
	for _, e := range []*onceonly.Engine{h.oneCommit, h.twoPhase} {
		if err := e.Register(stepFuncName, h.steppedFunc); err != nil {
			return nil, err
		}
		if err := e.Register(plainFuncName, h.plainFunc); err != nil {
			return nil, err
		}
	}
	for _, e := range []*onceonly.Engine{h.oneCommit, h.twoPhase, h.withDB} {
		if err := e.Start(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
	}
	mw := h.oneCommit.Middleware(onceonly.MiddlewareOptions{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Scope"), nil },
	})
	h.srv = httptest.NewUnstartedServer(mw(http.HandlerFunc(h.serveHTTP)))
	h.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handlers' panics, on purpose
	h.srv.Start()
	h.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h.stopWatch = stop
	h.watching.Go(func() { h.watchStalls(wctx) })
	ok = true
	return h, nil
}

func (h *harness) pool(ctx context.Context, conns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(h.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	h.pools = append(h.pools, pool)
	return pool, nil
}

// close stops the engines and closes everything newHarness opened; it
// may be called again.
func (h *harness) close() {
	h.closeOnce.Do(h.closeAll)
}

func (h *harness) closeAll() {
	if h.stopWatch != nil {
		h.stopWatch()
		h.watching.Wait()
	}
	if h.srv != nil {
		h.srv.Close()
	}
	for _, e := range []*onceonly.Engine{h.oneCommit, h.twoPhase, h.withDB} {
		if e != nil {
			e.Close()
		}
	}
	for _, db := range []*sql.DB{h.sqlDB, h.engDB} {
		if db != nil {
			_ = db.Close()
		}
	}
	if h.rdb != nil {
		_ = h.rdb.Close()
	}
	for _, p := range h.pools {
		p.Close()
	}
}

// stallThreshold is the longest a process may stand still unnoticed: the
// engine's margin, a sixth of the lease, past which a process that acts
// may do so after a takeover (docs/invariants.md, I4's limits).
const stallThreshold = historyLease / 6

// watchStalls records every time this process stood still longer than
// stallThreshold (a starved machine, a long GC pause), as a pause its
// runs are judged with: a ticker that fires late tells.
func (h *harness) watchStalls(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			now := time.Now() // not the tick's time, which a late receive does not see
			if now.Sub(last) > stallThreshold {
				if _, err := h.history.Exec(ctx, `INSERT INTO history_stalls (worker, from_at, to_at) VALUES ($1, $2, $3)`,
					h.cfg.Worker, last, now); err != nil && ctx.Err() == nil {
					h.recordErr(fmt.Errorf("record stall: %w", err))
				}
			}
			last = now
		}
	}
}

// recordErr counts a failure to record the history (which makes the
// history incomplete: the test reports it).
func (h *harness) recordErr(err error) {
	h.errs.Lock()
	defer h.errs.Unlock()
	h.errs.n++
	if len(h.errs.first) < 3 {
		h.errs.first = append(h.errs.first, err.Error())
	}
}

// recordErrors returns how many history writes failed, and the first few.
func (h *harness) recordErrors() (int, []string) {
	h.errs.Lock()
	defer h.errs.Unlock()
	return h.errs.n, append([]string(nil), h.errs.first...)
}

func (h *harness) newID(prefix string) string {
	return fmt.Sprintf("%s%s.%d", prefix, h.cfg.Worker, h.ids.Add(1))
}

// runBody is the stored result's body: the run that produced it.
type runBody struct {
	Run string `json:"run"`
}

// handle is every handler's body, whatever its entry point: it records the
// run's start, behaves as its attempt says (a nil attempt, a resumption,
// just succeeds), writes the business row through write (the execution's
// transaction), and records the run's end and result before it returns.
//
// The run's start is the time the handler is entered, not the time its
// record reaches Postgres: on a starved machine that record may wait for a
// connection past the run's lease, while another claim runs and commits.
// A run that finds its lease lost once its start is recorded, before its
// first action (step, sleep or write), stops there: it is recorded "lost",
// a run that did nothing.
func (h *harness) handle(ctx context.Context, a *attempt, mode string, step func(ctx context.Context) error, write func(ctx context.Context, runID string) error) (onceonly.Result, error) {
	entered := time.Now()
	attemptID, scope, key, payload := "", "", "", ""
	var b behaviour
	var version int64
	x, isExecution := onceonly.ExecutionOf(ctx)
	if isExecution {
		version = x.Fence().Version
	}
	if a != nil {
		attemptID, scope, key, payload, b = a.id, a.scope, a.key, a.payload, a.behave
	} else if isExecution {
		scope, key, payload = x.Scope(), x.Key(), string(x.Request())
		b = behaviour{Outcome: "ok"}
	}
	if oneCommitModes[mode] && version > 0 {
		// A one-commit entry point on a key that had a row (failed, taken
		// over) claims it two-phase: the run holds the key by that row.
		mode += rowSuffix
	}
	runID := h.newID("r")
	if _, err := h.history.Exec(context.WithoutCancel(ctx), `INSERT INTO history_runs
		(run_id, attempt_id, worker, scope, key, mode, payload, version, started_at, recorded_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp())`,
		runID, attemptID, h.cfg.Worker, scope, key, mode, payload, version, entered); err != nil {
		h.recordErr(fmt.Errorf("record run start: %w", err))
		return onceonly.Result{}, err
	}
	end := func(result string) {
		ended, endVersion := time.Now(), int64(0)
		if isExecution {
			endVersion = x.Fence().Version // above 0 once a step promoted a one-commit execution
		}
		if _, err := h.history.Exec(context.WithoutCancel(ctx),
			`UPDATE history_runs SET ended_at = $2, result = $3, end_version = $4 WHERE run_id = $1`, runID, ended, result, endVersion); err != nil {
			h.recordErr(fmt.Errorf("record run end: %w", err))
		}
	}
	sleep := func() error {
		t := time.NewTimer(b.Sleep)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("handler stopped: %w", context.Cause(ctx))
		}
	}
	if errors.Is(context.Cause(ctx), onceonly.ErrLeaseLost) {
		end("lost")
		return onceonly.Result{}, fmt.Errorf("handler stopped before acting: %w", context.Cause(ctx))
	}
	if step != nil {
		if err := step(ctx); err != nil {
			end("failed")
			return onceonly.Result{}, err
		}
	}
	if b.Sleep > 0 && !b.SleepAfterWrite {
		if err := sleep(); err != nil {
			end("canceled")
			return onceonly.Result{}, err
		}
	}
	if err := write(ctx, runID); err != nil {
		end("failed")
		return onceonly.Result{}, fmt.Errorf("business write: %w", err)
	}
	if b.Sleep > 0 && b.SleepAfterWrite {
		if err := sleep(); err != nil {
			end("canceled")
			return onceonly.Result{}, err
		}
	}
	switch b.Outcome {
	case "fail":
		end("failed")
		return onceonly.Result{}, errors.New("handler failed on purpose")
	case "status500":
		end("failed")
		return onceonly.Result{Status: http.StatusInternalServerError, ContentType: "text/plain", Body: []byte("try again")}, nil
	case "panic":
		end("panic")
		panic("handler panics on purpose")
	}
	end("ok")
	status := http.StatusCreated
	if len(runID)%5 == 0 { // a stored answer that is not a 2xx now and then
		status = http.StatusPaymentRequired
	}
	body, _ := json.Marshal(runBody{Run: runID}) //nolint:errchkjson // a struct of one string field always encodes
	return onceonly.Result{Status: status, ContentType: "application/json", Body: body}, nil
}

// pgxWrite writes the business row through an execution's pgx
// transaction.
func pgxWrite(tx pgx.Tx, scope, key string) func(ctx context.Context, runID string) error {
	return func(ctx context.Context, runID string) error {
		_, err := tx.Exec(ctx, `INSERT INTO history_effects (scope, key, run_id) VALUES ($1, $2, $3)`, scope, key, runID)
		return err
	}
}

// sqlWrite writes the business row through a database/sql transaction.
func sqlWrite(tx *sql.Tx, scope, key string) func(ctx context.Context, runID string) error {
	return func(ctx context.Context, runID string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO history_effects (scope, key, run_id) VALUES ($1, $2, $3)`, scope, key, runID)
		return err
	}
}

// plainFunc is the registered Func without a step.
func (h *harness) plainFunc(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	a, mode := attemptOf(ctx), entryRun
	if a == nil {
		mode = modeResume
	}
	return h.handle(ctx, a, mode, nil, func(ctx context.Context, runID string) error {
		tx, err := x.Tx(ctx)
		if err != nil {
			return err
		}
		return pgxWrite(tx, x.Scope(), x.Key())(ctx, runID)
	})
}

// steppedFunc is the registered Func that steps before its write: its
// first step promotes a one-commit execution to two-phase, and a failure
// after it hands the key off to the resumer.
func (h *harness) steppedFunc(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
	a, mode := attemptOf(ctx), entryRunStep
	if a == nil {
		mode = modeResume
	}
	step := func(ctx context.Context) error {
		_, err := onceonly.Step(ctx, "reserve", func(_ context.Context, downstream string) (string, error) {
			return downstream[:8], nil
		})
		return err
	}
	return h.handle(ctx, a, mode, step, func(ctx context.Context, runID string) error {
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return err
		}
		return pgxWrite(tx, x.Scope(), x.Key())(ctx, runID)
	})
}

// serveHTTP is the handler behind the middleware.
func (h *harness) serveHTTP(w http.ResponseWriter, r *http.Request) {
	v, _ := h.attempts.Load(r.Header.Get("X-Attempt"))
	a, _ := v.(*attempt)
	tx, err := onceonly.Tx(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	res, err := h.handle(r.Context(), a, entryHTTP, nil, pgxWrite(tx, r.Header.Get("X-Scope"), r.Header.Get(onceonly.HeaderKey)))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", res.ContentType)
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// told is what a caller was told by one call.
type told struct {
	kind, runID, detail string
	// settle is the consumer's settlement of the delivery (nil for the
	// other entry points).
	settle *onceonly.Settlement
}

// toldOf classifies an engine's answer.
func toldOf(out onceonly.Outcome, err error) told {
	if err == nil {
		var body runBody
		_ = json.Unmarshal(out.Body, &body)
		switch {
		case !onceonly.DefaultShouldStore(out.Status):
			return told{kind: toldFailed, detail: fmt.Sprintf("status %d", out.Status)}
		case out.Replayed:
			return told{kind: toldReplayed, runID: body.Run}
		}
		return told{kind: toldOK, runID: body.Run}
	}
	var failed *onceonly.ExecutionError
	switch _, inFlight := onceonly.IsInFlight(err); {
	case inFlight:
		return told{kind: toldInFlight}
	case errors.Is(err, onceonly.ErrLeaseLost):
		return told{kind: toldLost}
	case errors.Is(err, onceonly.ErrKeyReused):
		return told{kind: toldReused}
	case errors.As(err, &failed):
		return told{kind: toldFailed, detail: failed.Err.Error()}
	case errors.Is(err, onceonly.ErrUnavailable):
		return told{kind: toldUnavailable, detail: err.Error()}
	}
	return told{kind: toldOther, detail: err.Error()}
}

// call makes one call of a through its entry point.
func (h *harness) call(ctx context.Context, a *attempt) (t told) {
	defer func() {
		if p := recover(); p != nil {
			t = told{kind: toldPanic, detail: fmt.Sprint(p)}
		}
	}()
	payload := []byte(a.payload)
	handler := func(mode string) onceonly.Handler {
		return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			return h.handle(ctx, a, mode, nil, pgxWrite(tx, a.scope, a.key))
		}
	}
	switch a.entry {
	case entryDo1:
		return toldOf(h.oneCommit.Do(ctx, a.scope, a.key, payload, handler(entryDo1)))
	case entryDo2:
		return toldOf(h.twoPhase.Do(ctx, a.scope, a.key, payload, handler(entryDo2)))
	case entryConsumer:
		out, err := h.oneCommit.Do(ctx, a.scope, a.key, payload, handler(entryConsumer))
		t := toldOf(out, err)
		s := consumerPolicy.Settle(out, err)
		t.settle = &s
		if s.Disposition == onceonly.DeadLetter && t.kind == toldFailed {
			t.kind = toldDeadLetter
		}
		return t
	case entryRun:
		return toldOf(h.oneCommit.Run(context.WithValue(ctx, attemptKey{}, a), plainFuncName, a.scope, a.key, payload))
	case entryRunStep:
		return toldOf(h.oneCommit.Run(context.WithValue(ctx, attemptKey{}, a), stepFuncName, a.scope, a.key, payload))
	case entryDoSQL:
		return toldOf(h.withDB.DoSQL(ctx, a.scope, a.key, payload, func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
			return h.handle(ctx, a, entryDoSQL, nil, sqlWrite(tx, a.scope, a.key))
		}))
	case entryDoTx:
		return h.callDoTx(ctx, a, handler(entryDoTx))
	case entryDoSQLTx:
		return h.callDoSQLTx(ctx, a)
	case entryHTTP:
		return h.callHTTP(ctx, a)
	}
	panic("unknown entry " + a.entry)
}

// callDoTx runs DoTx in a transaction of the caller's, which it commits
// (its other work, had it any, stays usable after a failed execution).
func (h *harness) callDoTx(ctx context.Context, a *attempt, fn onceonly.Handler) told {
	tx, err := h.callers.Begin(ctx)
	if err != nil {
		return told{kind: toldUnavailable, detail: err.Error()}
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after a panic; a no-op after the commit
	t := toldOf(h.oneCommit.DoTx(ctx, tx, a.scope, a.key, []byte(a.payload), fn))
	if err := tx.Commit(ctx); err != nil && (t.kind == toldOK || t.kind == toldReplayed) {
		return told{kind: toldCommitErr, detail: err.Error()}
	}
	return t
}

// callDoSQLTx runs DoSQLTx in a database/sql transaction of the caller's,
// which it commits.
func (h *harness) callDoSQLTx(ctx context.Context, a *attempt) told {
	tx, err := h.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return told{kind: toldUnavailable, detail: err.Error()}
	}
	defer func() { _ = tx.Rollback() }()
	t := toldOf(h.oneCommit.DoSQLTx(ctx, tx, a.scope, a.key, []byte(a.payload), func(ctx context.Context, tx *sql.Tx) (onceonly.Result, error) {
		return h.handle(ctx, a, entryDoSQLTx, nil, sqlWrite(tx, a.scope, a.key))
	}))
	if err := tx.Commit(); err != nil && (t.kind == toldOK || t.kind == toldReplayed) {
		return told{kind: toldCommitErr, detail: err.Error()}
	}
	return t
}

// callHTTP sends the attempt through the middleware's server.
func (h *harness) callHTTP(ctx context.Context, a *attempt) told {
	h.attempts.Store(a.id, a)
	defer h.attempts.Delete(a.id)
	body, _ := json.Marshal(map[string]string{"payload": a.payload}) //nolint:errchkjson // a map of strings always encodes
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/ops", strings.NewReader(string(body)))
	if err != nil {
		return told{kind: toldOther, detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(onceonly.HeaderKey, a.key)
	req.Header.Set("X-Scope", a.scope)
	req.Header.Set("X-Attempt", a.id)
	res, err := h.client.Do(req)
	if err != nil {
		// The handler's panic: net/http closes the connection.
		return told{kind: toldPanic, detail: err.Error()}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	switch res.StatusCode {
	case http.StatusCreated, http.StatusPaymentRequired:
		var rb runBody
		_ = json.Unmarshal(raw, &rb)
		if res.Header.Get(onceonly.HeaderReplayed) == "true" {
			return told{kind: toldReplayed, runID: rb.Run}
		}
		return told{kind: toldOK, runID: rb.Run}
	case http.StatusConflict:
		if strings.Contains(string(raw), "took this Idempotency-Key over") {
			return told{kind: toldLost}
		}
		return told{kind: toldInFlight}
	case http.StatusUnprocessableEntity:
		return told{kind: toldReused}
	case http.StatusInternalServerError:
		return told{kind: toldFailed, detail: strings.TrimSpace(string(raw))}
	case http.StatusServiceUnavailable:
		return told{kind: toldUnavailable}
	}
	return told{kind: toldOther, detail: fmt.Sprintf("status %d: %s", res.StatusCode, raw)}
}

// recordCall records what a call was told.
func (h *harness) recordCall(ctx context.Context, a *attempt, started time.Time, t told) {
	if _, err := h.history.Exec(context.WithoutCancel(ctx), `INSERT INTO history_calls
		(attempt_id, worker, scope, key, entry, payload, started_at, ended_at, told, run_id, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		a.id, h.cfg.Worker, a.scope, a.key, a.entry, a.payload, started, time.Now(), t.kind, t.runID, t.detail); err != nil {
		h.recordErr(fmt.Errorf("record call: %w", err))
	}
}

// Bounds of a caller's retries: at once on an in-flight answer (as a
// client loop that retries on 409 does), up to maxInFlightRetries times
// or one lease and a half; and after a failure, a lost lease or a panic,
// up to maxFailedRetries more times.
const (
	maxInFlightRetries = 60
	maxFailedRetries   = 3
)

// consumerPolicy settles the consumer's deliveries: dead-lettered after
// as many failures of the key as a client retries, redelivered soon.
var consumerPolicy = onceonly.SettlePolicy{MaxFailures: maxFailedRetries + 1, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}

// drawBehaviour draws what a handler run does: mostly succeed, sometimes
// fail, answer 500, panic, sleep a little or sleep past the lease (the
// sleep before or after the business write).
func drawBehaviour(rng *rand.Rand, lease time.Duration) behaviour {
	var b behaviour
	switch p := rng.IntN(100); {
	case p < 60:
		b.Outcome = "ok"
	case p < 80:
		b.Outcome = "fail"
	case p < 88:
		b.Outcome = "status500"
	default:
		b.Outcome = "panic"
	}
	switch p := rng.IntN(100); {
	case p < 12:
		b.Sleep = time.Duration(20+rng.IntN(200)) * time.Millisecond
	case p < 16:
		b.Sleep = lease + time.Duration(200+rng.IntN(800))*time.Millisecond
	}
	b.SleepAfterWrite = rng.IntN(2) == 0
	return b
}

// runClient is one caller of a burst: it calls through one entry point
// with one payload and retries as a client loop or a broker redelivery
// would, recording every call.
func (h *harness) runClient(ctx context.Context, rng *rand.Rand, scope, key, entry, payload string) {
	deadline := time.Now().Add(h.cfg.Lease * 3 / 2)
	inFlight, failures := 0, 0
	for ctx.Err() == nil {
		a := &attempt{id: h.newID("a"), scope: scope, key: key, entry: entry, payload: payload, behave: drawBehaviour(rng, h.cfg.Lease)}
		started := time.Now()
		t := h.call(ctx, a)
		h.recordCall(ctx, a, started, t)
		switch t.kind {
		case toldOK, toldReplayed, toldReused, toldDeadLetter, toldOther:
			return
		case toldInFlight:
			if inFlight++; inFlight > maxInFlightRetries || time.Now().After(deadline) {
				return
			}
			continue // at once
		}
		if failures++; failures > maxFailedRetries {
			return
		}
		if t.settle != nil {
			// A broker redelivers after what Settle says, here at most 20 ms.
			time.Sleep(min(t.settle.After, 20*time.Millisecond)) // the redelivery delay, not a wait for an event
		}
	}
}

// slotKey returns the key that slot holds at now: slots change
// generation every keyPeriod, each at its own offset, counted from the
// run's start, so every process of the run agrees on the keys.
func (h *harness) slotKey(slot int, now time.Time) string {
	offset := keyPeriod * time.Duration(slot) / time.Duration(h.cfg.Slots)
	gen := int64((now.Sub(h.cfg.Start) + offset) / keyPeriod)
	return fmt.Sprintf("k%02d-g%d", slot, gen)
}

// load runs cfg.Bursts concurrent loops of bursts until cfg.Until: a burst
// is one to three clients that call one key at once, each through an entry
// point of its own, now and then with another payload than the key's.
// Burst i draws everything from the random stream (Seed, Stream, i).
func (h *harness) load(ctx context.Context) {
	var next atomic.Uint64
	var wg sync.WaitGroup
	for range h.cfg.Bursts {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(h.cfg.Until) {
				i := next.Add(1)
				rng := rand.New(rand.NewPCG(h.cfg.Seed, h.cfg.Stream<<32|i))
				scope := historyScopes[rng.IntN(len(historyScopes))]
				key := h.slotKey(rng.IntN(h.cfg.Slots), time.Now())
				// Half the bursts are storms of two to seven one-commit
				// callers; the others mix one to three of any entry point.
				entries, n := historyEntries, 1+rng.IntN(3)
				if rng.IntN(2) == 0 {
					entries, n = oneCommitEntries, 2+rng.IntN(6)
				}
				var clients sync.WaitGroup
				for range n {
					entry := entries[rng.IntN(len(entries))]
					payload := "p1"
					if rng.IntN(100) < 3 {
						payload = "p2" // the key reused with another payload
					}
					crng := rand.New(rand.NewPCG(h.cfg.Seed, rng.Uint64()))
					clients.Go(func() { h.runClient(ctx, crng, scope, key, entry, payload) })
				}
				clients.Wait()
			}
		})
	}
	wg.Wait()
}
