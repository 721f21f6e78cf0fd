package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/oncetest"
)

// TestChaosHistory is a history checker for exactly-once, in the spirit of
// Jepsen's Elle: randomized concurrent callers over a small key space (20
// key slots in 2 scopes, each slot renewed every keyPeriod) mix every
// execution mode and entry point of the engine on the same keys — Do on a
// one-commit engine and on a TwoPhase one, Run with and without a Step,
// the net/http middleware, DoTx, DoSQLTx, DoSQL on an engine with
// Config.DB, and a consumer that redelivers as Settle says. Handlers fail,
// panic, answer 500, sleep (some past the lease) and write one business
// row each through their execution's transaction; callers retry at once
// on 409 and after failures. Every handler run records its start, end and
// result in history_runs, outside its transaction, and every caller what
// it was told, while Redis goes up, down, flaps and turns slow (a fault
// proxy in front of a Redis of the test's own) and, in the "processes"
// variant, worker processes are killed (SIGKILL) and paused past the
// lease (SIGSTOP, SIGCONT). Then the checker (history_check_test.go)
// judges the whole history: no two runs of a key at once (I4), none after
// a committed run (I13), no committed run's caller told otherwise, no
// caller told another result than the committed one, no caller told
// "taken over" when nothing took over, no key that accepted another
// payload after a row, every key settled, one business row per completed
// key and none for others. It fails with a summary of the violations, put
// down to the engine's known bugs where their runs say which.
//
// It found, per minute of load, each of the engine's known bugs of the
// release before the key lock (a handler run after a commit, a failed
// execution discarding the next, two modes at once, an overrun leaving no
// row), then three since (a late promotion's row whose lease had run out,
// a resumption started on a claim older than its lease, a commit that
// landed reported as a lost lease). `make test` runs
// it short: HISTORY_DURATION (default 10s) is each variant's load;
// `make chaos-history` runs it at length. HISTORY_SEED is the seed of
// every random choice (printed; timings still differ between runs),
// HISTORY_VARIANT "inprocess" or "processes" one variant only,
// HISTORY_VERBOSE=1 logs every violation, not a few of each kind.
func TestChaosHistory(t *testing.T) {
	duration, err := time.ParseDuration(os.Getenv("HISTORY_DURATION"))
	if err != nil || duration <= 0 {
		duration = 10 * time.Second
	}
	seed, err := strconv.ParseUint(os.Getenv("HISTORY_SEED"), 10, 64)
	if err != nil {
		seed = rand.Uint64()
	}
	t.Logf("HISTORY_SEED=%d HISTORY_DURATION=%s", seed, duration)
	entries := map[string]any{}
	for _, variant := range []string{"inprocess", "processes"} {
		if only := os.Getenv("HISTORY_VARIANT"); only != "" && only != variant {
			continue
		}
		t.Run(variant, func(t *testing.T) {
			entries["history-"+variant] = runHistory(t, variant, seed, duration)
		})
	}
	writeSummary(t, entries)
}

// historyLease is the engines' LeaseTimeout: short, so that sleeps pass it.
const historyLease = 1500 * time.Millisecond

// HistorySummary is what a variant's run writes to the chaos summary.
type HistorySummary struct {
	Variant    string         `json:"variant"`
	Seed       uint64         `json:"seed"`
	DurationS  float64        `json:"duration_s"`
	Runs       int            `json:"runs"`
	Calls      int            `json:"calls"`
	Keys       int            `json:"keys"`
	Told       map[string]int `json:"told"`
	Modes      map[string]int `json:"modes"`
	Faults     map[string]int `json:"faults"`
	RecordErrs int            `json:"record_errors"`
	// RecordLagMS is the longest a run's start took to reach Postgres
	// after its handler was entered (the runs are judged by the latter).
	RecordLagMS int64              `json:"record_lag_max_ms"`
	Violations  violationSummary   `json:"violations"`
	PerMinute   map[string]float64 `json:"per_minute"`
}

// runHistory runs one variant: the load and its faults for duration, the
// wait until every key settled, then the checker.
func runHistory(t *testing.T, variant string, seed uint64, duration time.Duration) *HistorySummary {
	ctx := oncetest.ContextFor(t, duration+10*time.Minute)
	dbURL := oncetest.DatabaseURL(t)
	pool := oncetest.Pool(t, dbURL)
	if _, err := pool.Exec(ctx, historySchema); err != nil {
		t.Fatalf("create the history tables: %v", err)
	}
	redisSrv := oncetest.NewRedisServer(t)
	proxy, redisURL := oncetest.NewFaultProxyFor(t, redisSrv.URL())
	start := time.Now()
	cfg := harnessConfig{
		DatabaseURL: dbURL, RedisURL: redisURL, RedisPrefix: "h" + oncetest.RandomSuffix(8) + ":",
		Worker: "p0", Seed: seed, Lease: historyLease, Start: start, Until: start.Add(duration),
		Bursts: 6, Slots: 20, PoolConns: 12,
	}
	faults := &faultLog{counts: map[string]int{}, kills: map[string]time.Time{}}
	var workers []*historyWorker
	if variant == "processes" {
		cfg.Bursts, cfg.PoolConns = 0, 6 // this process runs the daemons only
		for i := 1; i <= 2; i++ {
			wc := cfg
			wc.Worker, wc.Stream, wc.Bursts, wc.PoolConns = fmt.Sprintf("w%d", i), uint64(i), 3, 10
			workers = append(workers, newHistoryWorker(t, wc))
		}
	}
	h, err := newHarness(ctx, cfg)
	if err != nil {
		t.Fatalf("start the engines: %v", err)
	}
	defer h.close()

	var wg sync.WaitGroup
	faultCtx, stopFaults := context.WithDeadline(ctx, cfg.Until)
	defer stopFaults()
	wg.Go(func() { redisFaults(faultCtx, rand.New(rand.NewPCG(seed, 1<<40)), proxy, faults) })
	for _, w := range workers {
		if err := w.start(); err != nil {
			t.Fatal(err)
		}
	}
	if len(workers) > 0 {
		wg.Go(func() { processFaults(faultCtx, rand.New(rand.NewPCG(seed, 1<<41)), workers, faults) })
	}
	h.load(ctx)
	wg.Wait()
	proxy.SetMode(oncetest.Pass)
	for _, w := range workers {
		if err := w.wait(cfg.Until.Add(2 * time.Minute)); err != nil {
			t.Error(err)
		}
	}
	loadTime := time.Since(start)

	// Every caller stopped: the key must settle within the leases, the
	// reaper's grace and a few reconcile and resume intervals.
	settled := oncetest.Poll(3*historyLease+30*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'`).Scan(&n)
		return err == nil && n == 0
	})
	if !settled {
		t.Log("some keys are still in progress after the wait: the checker reports them")
	}
	h.close()

	hist := readHistory(t, ctx, pool)
	hist.Lease, hist.Kills = historyLease, faults.kills
	s0 := len(hist.Pauses) // the stalls the processes noticed
	hist.Pauses = append(hist.Pauses, faults.pauses...)
	vs := check(hist)
	faults.count("stalls_over_lease_sixth", s0)
	s := &HistorySummary{Variant: variant, Seed: seed, DurationS: loadTime.Seconds(), Runs: len(hist.Runs), Calls: len(hist.Calls),
		Keys: len(hist.Keys), Told: map[string]int{}, Modes: map[string]int{}, Faults: faults.counts,
		Violations: summarize(vs, 3), PerMinute: map[string]float64{}}
	for _, c := range hist.Calls {
		s.Told[c.Told]++
	}
	for _, r := range hist.Runs {
		s.Modes[r.Mode]++
		s.RecordLagMS = max(s.RecordLagMS, r.Recorded.Sub(r.Start).Milliseconds())
	}
	n, first := h.recordErrors()
	for _, w := range workers {
		n += w.recordErrors()
	}
	s.RecordErrs = n
	if n > 0 {
		t.Errorf("%d history writes failed (the history is incomplete), first: %v", n, first)
	}
	minutes := loadTime.Minutes()
	for bug, count := range s.Violations.ByBug {
		s.PerMinute[bug] = float64(count) / minutes
	}
	t.Logf("history (%s, seed %d, %.0fs): %d runs, %d calls, %d keys, run starts recorded up to %d ms late\n  told: %v\n  runs by mode: %v\n  faults: %v",
		variant, seed, loadTime.Seconds(), s.Runs, s.Calls, s.Keys, s.RecordLagMS, s.Told, s.Modes, s.Faults)
	if os.Getenv("HISTORY_VERBOSE") == "1" {
		for _, v := range vs {
			t.Logf("violation (%s) %s: %s", v.Bug, v.Kind, v.Text)
		}
	}
	if len(vs) > 0 {
		t.Errorf("%d violations in the history (HISTORY_SEED=%d):\n%s", len(vs), seed, s.Violations.format(minutes))
	}
	return s
}

// readHistory reads the recorded history and the keys' final rows.
func readHistory(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *history {
	t.Helper()
	h := &history{Effects: map[string][]string{}, Keys: map[string]histKey{}}
	rows, err := pool.Query(ctx, `SELECT run_id, attempt_id, worker, scope, key, mode, payload, version, coalesce(end_version, 0),
		started_at, recorded_at, coalesce(ended_at, 'epoch'), coalesce(result, '') FROM history_runs`)
	if err != nil {
		t.Fatalf("read runs: %v", err)
	}
	for rows.Next() {
		var r histRun
		if err := rows.Scan(&r.ID, &r.Attempt, &r.Worker, &r.Scope, &r.Key, &r.Mode, &r.Payload, &r.Version, &r.EndVersion,
			&r.Start, &r.Recorded, &r.End, &r.Result); err != nil {
			t.Fatalf("read runs: %v", err)
		}
		if r.End.Equal(time.Unix(0, 0)) {
			r.End = time.Time{}
		}
		h.Runs = append(h.Runs, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read runs: %v", err)
	}
	rows, err = pool.Query(ctx, `SELECT attempt_id, worker, scope, key, entry, payload, started_at, ended_at, told, run_id, detail FROM history_calls`)
	if err != nil {
		t.Fatalf("read calls: %v", err)
	}
	for rows.Next() {
		var c histCall
		if err := rows.Scan(&c.Attempt, &c.Worker, &c.Scope, &c.Key, &c.Entry, &c.Payload, &c.Start, &c.End, &c.Told, &c.RunID, &c.Detail); err != nil {
			t.Fatalf("read calls: %v", err)
		}
		h.Calls = append(h.Calls, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read calls: %v", err)
	}
	rows, err = pool.Query(ctx, `SELECT scope, key, run_id FROM history_effects`)
	if err != nil {
		t.Fatalf("read business rows: %v", err)
	}
	for rows.Next() {
		var scope, key, run string
		if err := rows.Scan(&scope, &key, &run); err != nil {
			t.Fatalf("read business rows: %v", err)
		}
		h.Effects[refOf(scope, key)] = append(h.Effects[refOf(scope, key)], run)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read business rows: %v", err)
	}
	rows, err = pool.Query(ctx, `SELECT scope, key, status, coalesce(response_body, '') FROM idempotency_keys`)
	if err != nil {
		t.Fatalf("read keys: %v", err)
	}
	for rows.Next() {
		var scope, key, status string
		var body []byte
		if err := rows.Scan(&scope, &key, &status, &body); err != nil {
			t.Fatalf("read keys: %v", err)
		}
		var rb runBody
		_ = json.Unmarshal(body, &rb)
		h.Keys[refOf(scope, key)] = histKey{Status: status, RunID: rb.Run}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read keys: %v", err)
	}
	rows, err = pool.Query(ctx, `SELECT worker, from_at, to_at FROM history_stalls`)
	if err != nil {
		t.Fatalf("read stalls: %v", err)
	}
	for rows.Next() {
		var p histPause
		if err := rows.Scan(&p.Worker, &p.From, &p.To); err != nil {
			t.Fatalf("read stalls: %v", err)
		}
		h.Pauses = append(h.Pauses, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read stalls: %v", err)
	}
	for _, effects := range h.Effects {
		slices.Sort(effects)
	}
	return h
}

// faultLog records the faults injected: counts by kind (Redis phases in
// tenths of seconds), and the kills and pauses the checker needs.
type faultLog struct {
	mu     sync.Mutex
	counts map[string]int
	kills  map[string]time.Time
	pauses []histPause
}

func (f *faultLog) count(kind string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[kind] += n
}

// redisFaults switches Redis, through the proxy, between up, down
// (connections reset), flapping (down and up every 50-300 ms) and slow
// (each chunk delayed past the engines' RedisTimeout), in phases of 1-4
// s, until ctx ends. Redis is down or flapping about half of the time: the
// engine's known bugs need Postgres alone to answer.
func redisFaults(ctx context.Context, rng *rand.Rand, proxy *oncetest.FaultProxy, faults *faultLog) {
	defer proxy.SetMode(oncetest.Pass)
	for ctx.Err() == nil {
		d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
		phaseEnd := time.Now().Add(d)
		var phase string
		switch p := rng.IntN(100); {
		case p < 15:
			phase = "redis_up"
			proxy.SetMode(oncetest.Pass)
		case p < 65:
			phase = "redis_down"
			proxy.SetMode(oncetest.Reset)
		case p < 85:
			phase = "redis_flapping"
			for ctx.Err() == nil && time.Now().Before(phaseEnd) {
				if proxy.Mode() == oncetest.Reset {
					proxy.SetMode(oncetest.Pass)
				} else {
					proxy.SetMode(oncetest.Reset)
				}
				sleepCtx(ctx, time.Duration(50+rng.IntN(250))*time.Millisecond)
			}
		default:
			phase = "redis_slow"
			proxy.SetLatency(150 * time.Millisecond)
		}
		faults.count(phase+"_ds", int(d/(100*time.Millisecond)))
		sleepCtx(ctx, time.Until(phaseEnd))
	}
}

// sleepCtx sleeps d (a fault's length, not a wait for an event) or until
// ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// processFaults kills (SIGKILL, then starts again) or pauses past the
// lease (SIGSTOP, SIGCONT) a random worker process every 2-5 s until ctx
// ends, recording each for the checker.
func processFaults(ctx context.Context, rng *rand.Rand, workers []*historyWorker, faults *faultLog) {
	for {
		sleepCtx(ctx, time.Duration(2000+rng.IntN(3000))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		w := workers[rng.IntN(len(workers))]
		if rng.IntN(2) == 0 {
			tag, at := w.kill()
			faults.mu.Lock()
			faults.kills[tag] = at
			faults.mu.Unlock()
			faults.count("worker_killed", 1)
			if err := w.start(); err != nil {
				faults.count("worker_restart_failed", 1)
			}
			continue
		}
		d := historyLease + time.Duration(300+rng.IntN(1000))*time.Millisecond
		tag, from, to := w.pause(d)
		faults.mu.Lock()
		faults.pauses = append(faults.pauses, histPause{Worker: tag, From: from, To: to})
		faults.mu.Unlock()
		faults.count("worker_paused", 1)
	}
}

// historyWorker is a worker process: this test binary run as
// TestHistoryWorker, with its harnessConfig in HISTORY_WORKER. Each start
// is an incarnation of its own, tagged w<i>.<n> in the history.
type historyWorker struct {
	t       *testing.T
	cfg     harnessConfig
	logPath string

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{}
	incarnation int
	tag         string
}

func newHistoryWorker(t *testing.T, cfg harnessConfig) *historyWorker {
	return &historyWorker{t: t, cfg: cfg, logPath: filepath.Join(t.TempDir(), cfg.Worker+".log")}
}

// start starts a new incarnation of the worker.
func (w *historyWorker) start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.incarnation++
	cfg := w.cfg
	cfg.Worker = fmt.Sprintf("%s.%d", w.cfg.Worker, w.incarnation)
	cfg.Stream = w.cfg.Stream<<8 | uint64(w.incarnation) //nolint:gosec // a count of restarts, never negative
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	logs, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logs.Close()
	cmd := exec.CommandContext(w.t.Context(), os.Args[0], "-test.run=^TestHistoryWorker$", "-test.v",
		"-test.timeout="+(time.Until(cfg.Until)+5*time.Minute).String())
	cmd.Env = append(os.Environ(), "HISTORY_WORKER="+string(raw))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %s: %w", cfg.Worker, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	w.cmd, w.done, w.tag = cmd, done, cfg.Worker
	return nil
}

// kill sends SIGKILL to the running incarnation and returns its tag and
// the kill's time.
func (w *historyWorker) kill() (string, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := time.Now()
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
	return w.tag, at
}

// pause stops the running incarnation for d (SIGSTOP, then SIGCONT).
func (w *historyWorker) pause(d time.Duration) (string, time.Time, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := time.Now()
	_ = w.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(d) // the pause's length, not a wait for an event
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	return w.tag, from, time.Now()
}

// wait waits until the running incarnation exits by itself (its load
// ended), until deadline.
func (w *historyWorker) wait(deadline time.Time) error {
	w.mu.Lock()
	done, cmd := w.done, w.cmd
	w.mu.Unlock()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
		_ = cmd.Process.Kill()
		return fmt.Errorf("worker %s did not end by itself:\n%s", w.tag, w.tail())
	}
	if cmd.ProcessState != nil && !cmd.ProcessState.Success() {
		return fmt.Errorf("worker %s failed: %v\n%s", w.tag, cmd.ProcessState, w.tail())
	}
	return nil
}

// recordErrors returns how many history writes the worker's incarnations
// said failed (their logs' "record errors: n" lines).
func (w *historyWorker) recordErrors() int {
	raw, _ := os.ReadFile(w.logPath)
	n := 0
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "record errors: "); ok {
			m, _ := strconv.Atoi(strings.Fields(rest)[0])
			n += m
		}
	}
	return n
}

func (w *historyWorker) tail() string {
	raw, _ := os.ReadFile(w.logPath)
	if len(raw) > 3000 {
		raw = raw[len(raw)-3000:]
	}
	return string(raw)
}

// TestHistoryWorker is a worker process of TestChaosHistory's "processes"
// variant: it runs the workload its HISTORY_WORKER configuration says,
// recording into the history, until the configuration's end. Run by
// itself it does nothing.
func TestHistoryWorker(t *testing.T) {
	raw := os.Getenv("HISTORY_WORKER")
	if raw == "" {
		t.Skip("a worker process of TestChaosHistory (HISTORY_WORKER unset)")
	}
	var cfg harnessConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("HISTORY_WORKER: %v", err)
	}
	ctx := t.Context()
	h, err := newHarness(ctx, cfg)
	if err != nil {
		t.Fatalf("start the engines: %v", err)
	}
	defer h.close()
	h.load(ctx)
	n, first := h.recordErrors()
	fmt.Fprintf(os.Stdout, "record errors: %d %v\n", n, first)
}
