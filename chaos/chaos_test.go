// Package chaos runs the whole system — two api processes, two relays, a
// reconciler and the payment gateway, as real binaries on real Postgres and
// Redis servers — under a load of retried payments while processes are
// killed or paused past their lease, servers flushed and restarted, and the
// gateway charges then fails, hangs or resets, then checks the invariants,
// those of the charges (one external effect; nothing is left half done)
// included. It runs once on a single Redis server and once on a
// three-master Redis Cluster, where slots also move.
//
// CHAOS_DURATION (default 20s) sets the length of the load, CHAOS_PAYMENTS
// (default 400) the number of logical payments (per run), CHAOS_REDIS
// "single" or "cluster" one run only, CHAOS_SUMMARY a path for the JSON
// summaries. `make chaos` runs long ones.
//
// A run's deadlines grow with CHAOS_DURATION (loadTimeout, checksTimeout);
// a run that fails still writes what it measured to the summary, with
// "failed" set and "reached" naming the stage it got to.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/reconcile"
)

const (
	leaseTimeout      = 2 * time.Second
	reconcileInterval = time.Second
	reapGrace         = 100 * time.Millisecond
	resumeInterval    = 300 * time.Millisecond
	sourceHeader      = "X-Chaos-Source"
	// gatewayFaults are the gateway's injected faults: a charge whose
	// answer is a 500, hangs past the api's GATEWAY_TIMEOUT or is cut by a
	// reset, and a 503 before charging.
	gatewayFaults  = "charge_then_500=0.05,charge_then_hang=0.04,charge_then_reset=0.05,fail_before_charge=0.05"
	gatewayHang    = 3 * time.Second
	gatewayTimeout = 1500 * time.Millisecond
	// openTxLimit is how long an api transaction may sit idle before the
	// sampler calls it open across a gateway call (which takes at least
	// GATEWAY_TIMEOUT when it hangs).
	openTxLimit = 700 * time.Millisecond
)

// Summary is the JSON the run writes. A failed run writes what it
// measured before it stopped.
type Summary struct {
	Failed         bool           `json:"failed"`
	Reached        string         `json:"reached"` // setup, load, checks or done
	DurationS      float64        `json:"duration_s"`
	Payments       int            `json:"payments"`
	Operations     int            `json:"operations"`
	DuplicatesSent int            `json:"duplicates_sent"`
	Requests       int            `json:"requests"`
	Statuses       map[string]int `json:"statuses"`
	Faults         map[string]int `json:"faults"`
	Violations     []string       `json:"violations"`
	// Charges counts the keys the gateway charged; SettledWithoutClient
	// those whose clients never got a final answer, finished by the engine.
	Charges              int `json:"charges"`
	SettledWithoutClient int `json:"settled_without_client"`
}

// answer is the final answer of one operation.
type answer struct {
	status int
	body   string
	err    error
	// gaveUp marks an operation whose client tried once and gave up,
	// whatever it got: the engine finishes what it started on its own.
	gaveUp bool
}

// recorder is an http.RoundTripper that counts every status the apis send,
// with the time, for the 5xx checks.
type recorder struct {
	mu       sync.Mutex
	statuses map[int]int
	bad      []string // 5xx that no fault explains
	pgDown   func(time.Time) bool
	// paused reports whether the api at host was paused around a time.
	paused func(host string, at time.Time) bool
	// gatewayFaults is true when the gateway injects faults: a 502 of any
	// source is then explained.
	gatewayFaults bool
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses[res.StatusCode]++
	source := req.Header.Get(sourceHeader)
	switch {
	case res.StatusCode < 500:
	case res.StatusCode == http.StatusBadGateway && (source == "tok_gatewayError" || r.gatewayFaults):
		// The gateway failed (tok_gatewayError), or its answer was lost to an
		// injected fault and the engine settles the key on its own.
	case res.StatusCode == http.StatusServiceUnavailable && (r.pgDown(time.Now()) || r.paused(req.URL.Host, time.Now())):
		// Postgres was down, or the api stood still past the request's
		// deadline (SIGSTOP).
	default:
		r.bad = append(r.bad, fmt.Sprintf("%d for %s (%s) at %s", res.StatusCode, req.Header.Get(client.HeaderKey), source, time.Now().Format(time.StampMilli)))
	}
	return res, nil
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestChaos runs the stack once on a single Redis server and once on a
// three-master Redis Cluster (CHAOS_REDIS=single or cluster picks one).
func TestChaos(t *testing.T) {
	duration, err := time.ParseDuration(os.Getenv("CHAOS_DURATION"))
	if err != nil || duration <= 0 {
		duration = 20 * time.Second
	}
	payments := envInt("CHAOS_PAYMENTS", 400)
	bins := buildCommands(t)
	summaries := map[string]*Summary{}
	for _, target := range []string{"single", "cluster"} {
		if only := os.Getenv("CHAOS_REDIS"); only != "" && only != target {
			continue
		}
		s := &Summary{Reached: "setup", Payments: payments, Statuses: map[string]int{}, Faults: map[string]int{},
			Violations: []string{}} // [] rather than null in the JSON
		summaries[target] = s
		ok := t.Run(target, func(t *testing.T) {
			runChaos(t, bins, target, duration, payments, s)
		})
		s.Failed = !ok
	}
	entries := map[string]any{}
	for target, s := range summaries {
		entries[target] = s
	}
	writeSummary(t, entries)
}

// chaosRedis is the Redis a chaos run uses: one server, or a cluster.
type chaosRedis struct {
	env     string                  // REDIS_URL=… or REDIS_CLUSTER_URL=…
	servers []*oncetest.RedisServer // the server, or the cluster's masters
	cluster *oncetest.RedisCluster  // nil for a single server
	client  redis.UniversalClient
}

func newChaosRedis(t *testing.T, target string) *chaosRedis {
	if target == "cluster" {
		c := oncetest.NewRedisCluster(t)
		return &chaosRedis{env: "REDIS_CLUSTER_URL=" + c.URL(), servers: c.Nodes, cluster: c, client: c.Client(t)}
	}
	srv := oncetest.NewRedisServer(t)
	return &chaosRedis{env: "REDIS_URL=" + srv.URL(), servers: []*oncetest.RedisServer{srv}, client: oncetest.RedisClient(t, srv.URL())}
}

// flush empties every server.
func (r *chaosRedis) flush(ctx context.Context) error {
	return cache.ForEachNode(ctx, r.client, func(ctx context.Context, node redis.UniversalClient) error {
		return node.FlushAll(ctx).Err()
	})
}

// restart restarts one server (a random master) empty.
func (r *chaosRedis) restart() { r.servers[rand.IntN(len(r.servers))].Restart() }

// healthy reports whether the cluster is healthy enough to start a
// migration; an unhealthy one (a master restarting) is no error, the slot
// stays where it is this time.
func (r *chaosRedis) healthy(ctx context.Context) bool {
	return r.cluster.Healthy(ctx) == nil
}

// moveSlot moves a random slot to another master, if the cluster is healthy
// enough to start a migration; it reports whether it did.
func (r *chaosRedis) moveSlot(ctx context.Context) (bool, error) {
	if r.cluster == nil || !r.healthy(ctx) {
		return false, nil
	}
	slot := rand.IntN(16384)
	if err := r.cluster.MoveSlot(ctx, slot, r.servers[rand.IntN(len(r.servers))]); err != nil {
		return false, fmt.Errorf("move slot %d: %w", slot, err)
	}
	return true, nil
}

// The deadlines of a run grow with its duration. The setup and the load
// get twice the duration plus three minutes (the load runs past the
// duration while retries finish); the post-load checks (outbox drain, the
// lease and reaping wait, a reconciler pass, the per-key checks, the
// daemons' shutdown) get their own three minutes plus the duration, from
// the end of the load, so a load that overran is still checked. Neither
// runs past half a minute before go test's -timeout would kill the binary:
// the run fails with its summary rather than a panic.
func loadTimeout(t *testing.T, duration time.Duration) time.Duration {
	return clampToTest(t, 2*duration+3*time.Minute)
}

func checksTimeout(t *testing.T, duration time.Duration) time.Duration {
	return clampToTest(t, duration+3*time.Minute)
}

func clampToTest(t *testing.T, d time.Duration) time.Duration {
	if deadline, ok := t.Deadline(); ok {
		if left := time.Until(deadline) - 30*time.Second; left > 0 && left < d {
			d = left
		}
	}
	return d
}

// violationKey finds the idempotency keys a violation names.
var violationKey = regexp.MustCompile(`chaos-[0-9]+`)

// runChaos runs one chaos run on target, filling s as it goes: a run that
// stops early leaves what it measured in s.
func runChaos(t *testing.T, bins, target string, duration time.Duration, payments int, s *Summary) {
	timeout := loadTimeout(t, duration)
	ctx := oncetest.ContextFor(t, timeout)
	violate := func(msg string) {
		s.Violations = append(s.Violations, msg)
		t.Error(msg)
	}
	defer func() {
		out, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			t.Errorf("encode the summary: %v", err)
			return
		}
		t.Logf("chaos summary:\n%s", out)
	}()
	pg := oncetest.NewPostgresServer(t)
	rds := newChaosRedis(t, target)
	env := []string{"DATABASE_URL=" + pg.URL(), rds.env, "LOG_LEVEL=warn"}
	if _, err := runOnce(ctx, bins+"/api", env, "migrate", "up"); err != nil {
		t.Fatal(err)
	}
	gw := newProc(t, "gateway", bins+"/gateway", oncetest.FreeAddr(t), "DATABASE_URL="+pg.URL(), "LOG_LEVEL=warn",
		"SLOW_GATEWAY_DELAY=300ms", "GATEWAY_FAULTS="+gatewayFaults, "GATEWAY_HANG="+gatewayHang.String())
	// The apis name their connections, so the sampler below finds their
	// transactions.
	apiEnv := []string{rds.env, "LOG_LEVEL=warn",
		"LEASE_TIMEOUT=" + leaseTimeout.String(), "RESUME_INTERVAL=" + resumeInterval.String(),
		"GATEWAY_URL=http://" + gw.addr, "GATEWAY_TIMEOUT=" + gatewayTimeout.String(), "API_KEYS=sk_chaos=acct_chaos"}
	apis := []*proc{
		newProc(t, "api1", bins+"/api", oncetest.FreeAddr(t), append(apiEnv, "DATABASE_URL="+pg.URL()+"&application_name=chaos_api1")...),
		newProc(t, "api2", bins+"/api", oncetest.FreeAddr(t), append(apiEnv, "DATABASE_URL="+pg.URL()+"&application_name=chaos_api2")...),
	}
	relays := []*proc{ // one listens, one polls (as behind PgBouncer without DATABASE_SESSION_URL)
		newProc(t, "relay1", bins+"/relay", oncetest.FreeAddr(t), append(env, "RELAY_POLL_INTERVAL=200ms", "DATABASE_SESSION_URL="+pg.URL())...),
		newProc(t, "relay2", bins+"/relay", oncetest.FreeAddr(t), append(env, "RELAY_POLL_INTERVAL=200ms")...),
	}
	reconciler := newProc(t, "reconciler", bins+"/reconciler", oncetest.FreeAddr(t),
		append(env, "RECONCILE_SCHEDULE=@every "+reconcileInterval.String(), "REAP_GRACE="+reapGrace.String())...)
	all := append(append(append([]*proc{gw}, apis...), relays...), reconciler)
	for _, p := range all {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, p := range all {
			p.kill()
		}
		if t.Failed() {
			for _, p := range all {
				t.Logf("--- %s log tail:\n%s", p.name, p.tail())
			}
			for _, v := range s.Violations {
				for _, key := range violationKey.FindAllString(v, -1) {
					for _, p := range all {
						if lines := p.lines(key); lines != "" {
							t.Logf("--- %s log lines of %s:\n%s", p.name, key, lines)
						}
					}
				}
			}
		}
	})

	// Faults, until the load ends.
	var pgMu sync.Mutex
	var pgDownFrom, pgDownTo time.Time
	rec := &recorder{statuses: map[int]int{}, gatewayFaults: true, pgDown: func(at time.Time) bool {
		pgMu.Lock()
		defer pgMu.Unlock()
		return !pgDownFrom.IsZero() && at.After(pgDownFrom.Add(-time.Second)) &&
			(pgDownTo.IsZero() || at.Before(pgDownTo.Add(5*time.Second)))
	}, paused: func(host string, at time.Time) bool {
		for _, api := range apis {
			if api.addr == host {
				return api.pausedAround(at)
			}
		}
		return false
	}}
	faults := s.Faults
	var faultErrs []string
	loadCtx, endLoad := context.WithCancel(ctx)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		faultErrs = injectFaults(loadCtx, duration, apis, relays, rds, func() {
			pgMu.Lock()
			pgDownFrom = time.Now()
			pgMu.Unlock()
			pg.Restart()
			pgMu.Lock()
			pgDownTo = time.Now()
			pgMu.Unlock()
		}, faults)
	}()

	// No transaction open across a gateway call: sample the apis'
	// sessions while calls are held (hung, slow) at the gateway.
	openTx := make(chan []string, 1)
	go func() { openTx <- sampleOpenTransactions(loadCtx, pg.URL(), apis) }()

	// The load: every payment sent several times, some copies at once,
	// some later, to either api.
	s.Reached = "load"
	began := time.Now()
	answers := runLoad(ctx, payments, duration, apis, rec)
	endLoad()
	<-faultsDone
	for _, v := range <-openTx {
		violate(v)
	}
	s.DurationS = time.Since(began).Seconds()

	// Quiesce, then check.
	for key := range answers {
		s.Operations += len(answers[key])
	}
	s.DuplicatesSent = s.Operations - payments
	rec.mu.Lock()
	for status, n := range rec.statuses {
		s.Statuses[strconv.Itoa(status)] = n
		s.Requests += n
	}
	bad := append([]string{}, rec.bad...)
	rec.mu.Unlock()
	for _, v := range append(bad, faultErrs...) {
		violate(v)
	}
	if ctx.Err() != nil {
		violate(fmt.Sprintf("the setup and load outlasted their deadline (%s): %v", timeout, context.Cause(ctx)))
	}

	s.Reached = "checks"
	ctx = oncetest.ContextFor(t, checksTimeout(t, duration))
	if rds.cluster != nil {
		rds.cluster.WaitHealthy()
	}
	pool := oncetest.Pool(t, pg.URL())
	checkCharges(ctx, pool, answers, s, violate)
	checkInvariants(t, ctx, pool, rds.client, bins, env, reconciler, answers, violate)
	for _, p := range all {
		if err := p.stop(); err != nil {
			violate(err.Error())
		}
	}
	if s.Faults["kill_api"]+s.Faults["kill_relay"]+s.Faults["pause_api"] == 0 || s.Faults["restart_postgres"] != 1 {
		t.Errorf("the run injected too few faults: %v", s.Faults)
	}
	s.Reached = "done"
}

// injectFaults kills and restarts processes and flushes and restarts Redis
// at random until ctx ends, and restarts Postgres once, near the middle. It
// returns the processes that failed to come back.
func injectFaults(ctx context.Context, duration time.Duration, apis, relays []*proc,
	rds *chaosRedis, restartPostgres func(), faults map[string]int,
) (errs []string) {
	pgAt := time.Now().Add(duration * 2 / 5)
	pgDone := false
	restart := func(p *proc, fault string) {
		p.kill()
		time.Sleep(200 * time.Millisecond) // the time the process stays down (kill waits for its exit)
		if err := p.start(); err != nil {
			errs = append(errs, err.Error())
		}
		faults[fault]++
	}
	for {
		select {
		case <-ctx.Done():
			return errs
		case <-time.After(time.Duration(700+rand.IntN(900)) * time.Millisecond):
		}
		if !pgDone && time.Now().After(pgAt) {
			pgDone = true
			restartPostgres()
			faults["restart_postgres"]++
			continue
		}
		switch rand.IntN(6) {
		case 0:
			restart(apis[rand.IntN(len(apis))], "kill_api")
		case 1:
			restart(relays[rand.IntN(len(relays))], "kill_relay")
		case 2:
			if rds.flush(ctx) == nil {
				faults["flush_redis"]++
			}
		case 3:
			rds.restart()
			faults["restart_redis"]++
		case 4:
			// A migration, once begun, is finished even when the load ends:
			// a slot left half-moved would fail the checks.
			moved, err := rds.moveSlot(context.WithoutCancel(ctx))
			if err != nil {
				errs = append(errs, err.Error())
			}
			if moved {
				faults["move_slot"]++
			}
		case 5:
			// Past the lease: a retry elsewhere takes the key over while the
			// paused api may be inside a gateway call.
			apis[rand.IntN(len(apis))].pause(leaseTimeout + 500*time.Millisecond)
			faults["pause_api"]++
		}
	}
}

var sources = []string{"tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_visa",
	"tok_chargeDeclined", "tok_gatewayError", "tok_slow", "tok_slow"}

// runLoad sends every payment 2–4 times and returns the final answers per
// key.
func runLoad(ctx context.Context, payments int, duration time.Duration, apis []*proc, rec *recorder) map[string][]answer {
	c := &client.Client{HTTP: &http.Client{Timeout: 5 * time.Second, Transport: rec},
		MaxAttempts: 12, MinDelay: 50 * time.Millisecond, MaxDelay: 700 * time.Millisecond}
	// Every tenth payment is sent once by a client that gives up on any
	// answer but a final one: nobody retries it.
	once := &client.Client{HTTP: c.HTTP, MaxAttempts: 1}
	var mu sync.Mutex
	answers := make(map[string][]answer, payments)
	sem := make(chan struct{}, 48)
	var wg sync.WaitGroup
	for i := range payments {
		key := fmt.Sprintf("chaos-%d", i)
		source := sources[i%len(sources)]
		body := fmt.Sprintf(`{"amount":%d,"currency":"eur","customer":"cus_%d","source":%q}`, 100+i, i, source)
		start := time.Duration(rand.Int64N(int64(duration * 4 / 5)))
		copies, sender, gaveUp := 2+rand.IntN(3), c, i%10 == 5
		if gaveUp {
			copies, sender = 1, once
		}
		for j := range copies {
			delay := start
			if j > 0 && rand.IntN(2) == 0 {
				delay += time.Duration(rand.IntN(1500)) * time.Millisecond // a later retry
			}
			api := apis[(i+j)%len(apis)]
			wg.Go(func() {
				time.Sleep(delay) // the operation's place in the load's schedule
				sem <- struct{}{}
				defer func() { <-sem }()
				opCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				res, err := sender.Do(opCtx, client.Request{
					Method: "POST", URL: "http://" + api.addr + "/v1/payments", Key: key, Body: []byte(body),
					Header: http.Header{"Authorization": {"Bearer sk_chaos"}, sourceHeader: {source}},
				})
				a := answer{err: err, gaveUp: gaveUp}
				if res != nil {
					a.status, a.body = res.StatusCode, string(res.Body)
				}
				mu.Lock()
				answers[key] = append(answers[key], a)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return answers
}

// checkInvariants waits for the system to settle and reports to violate, as
// it finds it, every violation of these invariants: the business effect
// happens once, every replay is the first answer, a crash blocks a key for
// one lease at most, Redis converges to Postgres, no event is lost; a check
// that cannot run is reported too, and ends the checks.
func checkInvariants(t *testing.T, ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient,
	bins string, env []string, reconciler *proc, answers map[string][]answer, violate func(string),
) {
	// No event is lost: the relays drain the outbox.
	var pending int
	var pendingErr error
	if !settle(30*time.Second, func() bool {
		pendingErr = pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&pending)
		return pendingErr == nil && pending == 0
	}) {
		violate(fmt.Sprintf("no event is lost: the outbox did not drain within 30 s (%d events left, err %v)", pending, pendingErr))
	}
	// A crash blocks a key for one lease at most: nothing stays in progress
	// past its lease plus one reconcile interval (and the grace). Every key
	// settles by then unless one is stuck: wait for that, or as long as
	// that at most, then count.
	settle(leaseTimeout+reapGrace+2*reconcileInterval, func() bool {
		var inProgress int
		return pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'`).Scan(&inProgress) == nil &&
			inProgress == 0
	})
	var stuck int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'
		AND lease_expires_at < now() - $1::interval`, reapGrace+reconcileInterval).Scan(&stuck); err != nil {
		violate("a crash blocks a key for one lease at most: count the keys in progress: " + err.Error())
		return
	}
	if stuck > 0 {
		violate(fmt.Sprintf("a crash blocks a key for one lease at most: %d keys in progress past lease + grace + one reconcile interval", stuck))
	}
	// Redis converges to Postgres: once the daemon's passes are done, a
	// pass finds no drift. The daemon repairs what the faults left (a Redis
	// that came back empty, a cluster that was down): wait for two of its
	// full passes, so one began after the system settled.
	if !awaitReconcilePasses(reconciler, 2, 30*time.Second) {
		t.Log("the reconciler made no two full passes within 30 s; checking anyway")
	}
	if err := reconciler.stop(); err != nil {
		violate(err.Error())
	}
	out, err := runOnce(ctx, bins+"/reconciler", env, "--once")
	if err != nil {
		violate("Redis converges to Postgres: " + err.Error())
		return
	}
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		violate(fmt.Sprintf("Redis converges to Postgres: reconciler --once printed %q: %v", out, err))
		return
	}
	if rep.Drift() != 0 {
		violate("Redis converges to Postgres: reconciler --once after quiescing found drift: " + out)
	}
	c := cache.New(rdb, cache.Options{})
	for _, d := range oncetest.Drift(t, ctx, pool, c, "%") {
		violate("Redis converges to Postgres: " + d)
	}
	// The business effect happens once and every replay is the first
	// answer, key by key.
	rows := map[string]map[string]int{}
	r, err := pool.Query(ctx, `SELECT idempotency_key, status, count(*) FROM payments WHERE merchant_id = 'acct_chaos' GROUP BY 1, 2`)
	if err != nil {
		violate("the business effect happens once: read the payments: " + err.Error())
		return
	}
	for r.Next() {
		var key, status string
		var n int
		if err := r.Scan(&key, &status, &n); err != nil {
			r.Close()
			violate("the business effect happens once: read the payments: " + err.Error())
			return
		}
		if rows[key] == nil {
			rows[key] = map[string]int{}
		}
		rows[key][status] = n
	}
	r.Close()
	if err := r.Err(); err != nil {
		violate("the business effect happens once: read the payments: " + err.Error())
		return
	}
	for key, as := range answers {
		i, _ := strconv.Atoi(key[len("chaos-"):])
		if sources[i%len(sources)] == "tok_gatewayError" && len(rows[key]) > 0 {
			violate(fmt.Sprintf("the business effect happens once: %s (gateway error) has payment rows %v", key, rows[key]))
		}
		var stored string
		created, declined := false, false
		for _, a := range as {
			if a.err != nil && a.status == 0 && !a.gaveUp {
				violate(fmt.Sprintf("%s: no answer: %v", key, a.err))
				continue
			}
			if a.status/100 != 2 && a.status != http.StatusPaymentRequired {
				continue
			}
			created = created || a.status == http.StatusCreated
			declined = declined || a.status == http.StatusPaymentRequired
			if stored == "" {
				stored = a.body
			} else if a.body != stored {
				violate(fmt.Sprintf("every replay is the first answer: %s: two different stored answers:\n  %s\n  %s", key, stored, a.body))
			}
		}
		total := rows[key]["succeeded"] + rows[key]["declined"]
		switch {
		case total > 1:
			violate(fmt.Sprintf("the business effect happens once: %s has %d payment rows", key, total))
		case created && rows[key]["succeeded"] != 1:
			violate(fmt.Sprintf("the business effect happens once: %s answered 201 but has %d succeeded rows", key, rows[key]["succeeded"]))
		case declined && rows[key]["declined"] != 1:
			violate(fmt.Sprintf("the business effect happens once: %s answered 402 but has %d declined rows", key, rows[key]["declined"]))
		}
	}
}

// sampleOpenTransactions looks every 50 ms, until ctx ends, for api
// transactions idle longer than openTxLimit: a transaction held open across
// a call to the gateway. It returns one violation per sighting. The
// transactions of an api paused (SIGSTOP) meanwhile are left out: they
// wait for their process, not for a call (apis[i] is application_name
// chaos_api<i+1>).
func sampleOpenTransactions(ctx context.Context, url string, apis []*proc) []string {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return []string{"sample transactions: " + err.Error()}
	}
	defer pool.Close()
	var found []string
	for ctx.Err() == nil {
		rows, err := pool.Query(ctx, `SELECT pid, application_name, left(query, 80), extract(epoch FROM now() - state_change)
			FROM pg_stat_activity WHERE application_name LIKE 'chaos_api%' AND state = 'idle in transaction'
			AND now() - state_change > $1::interval`, openTxLimit)
		if err == nil {
			for rows.Next() {
				var pid int
				var app, query string
				var idle float64
				if rows.Scan(&pid, &app, &query, &idle) == nil && !pausedWhileIdle(apis, app, idle) {
					found = append(found, fmt.Sprintf("an api transaction (pid %d) idle for %.1f s after %q: open across a gateway call?", pid, idle, query))
				}
			}
			rows.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return found
}

// pausedWhileIdle reports whether the api named app (chaos_api<n>) was
// paused while its transaction sat idle for idle seconds, up to now.
func pausedWhileIdle(apis []*proc, app string, idle float64) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(app, "chaos_api"))
	if err != nil || n < 1 || n > len(apis) {
		return false
	}
	now := time.Now()
	return apis[n-1].pausedAround(now) || apis[n-1].pausedAround(now.Add(-time.Duration(idle*float64(time.Second))))
}

// checkCharges waits until no execution that started a step is left
// unfinished (the engine settles those on its own: nothing is left half
// done), then checks the charges against the payments: at most one charge
// per key (one external effect), no charge without exactly one payment row
// with its id, no payment without its charge, and every 201 carrying the
// charge the gateway made.
func checkCharges(ctx context.Context, pool *pgxpool.Pool, answers map[string][]answer, s *Summary, violate func(string)) {
	var open int
	var openErr error
	if !settle(leaseTimeout+30*time.Second, func() bool {
		openErr = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress' AND steps IS NOT NULL`).Scan(&open)
		return openErr == nil && open == 0
	}) {
		violate(fmt.Sprintf("nothing is left half done: %d executions that reached the gateway are still unfinished 30 s after the load (err %v)", open, openErr))
	}
	type charge struct{ id, status string }
	charges := map[string][]charge{} // by idempotency key
	rows, err := pool.Query(ctx, `SELECT split_part(reference, '/', 2), charge_id, status FROM gateway.charges
		WHERE reference LIKE 'acct_chaos/%' AND status <> 'processing'`)
	if err != nil {
		violate("one external effect: read the charges: " + err.Error())
		return
	}
	for rows.Next() {
		var key string
		var c charge
		if err := rows.Scan(&key, &c.id, &c.status); err != nil {
			violate("one external effect: read the charges: " + err.Error())
			rows.Close()
			return
		}
		charges[key] = append(charges[key], c)
	}
	rows.Close()
	paid := map[string][]string{} // charge ids of the payment rows, by key
	rows, err = pool.Query(ctx, `SELECT idempotency_key, coalesce(charge_id, '') FROM payments WHERE merchant_id = 'acct_chaos'`)
	if err != nil {
		violate("nothing is left half done: read the payments: " + err.Error())
		return
	}
	for rows.Next() {
		var key, id string
		if err := rows.Scan(&key, &id); err != nil {
			violate("nothing is left half done: read the payments: " + err.Error())
			rows.Close()
			return
		}
		paid[key] = append(paid[key], id)
	}
	rows.Close()
	for key, cs := range charges {
		s.Charges++
		if len(cs) > 1 {
			violate(fmt.Sprintf("one external effect: %s was charged %d times: %v", key, len(cs), cs))
		}
		if len(paid[key]) != 1 || paid[key][0] != cs[0].id {
			violate(fmt.Sprintf("nothing is left half done: %s: charge %s has payment rows with charges %v", key, cs[0].id, paid[key]))
		}
	}
	for key, ids := range paid {
		if len(charges[key]) == 0 {
			violate(fmt.Sprintf("nothing is left half done: %s has a payment (charges %v) without a charge", key, ids))
		}
	}
	for key, as := range answers {
		for _, a := range as {
			if a.status != http.StatusCreated {
				continue
			}
			var p struct {
				Charge string `json:"charge"`
			}
			if err := json.Unmarshal([]byte(a.body), &p); err != nil || len(charges[key]) == 0 || p.Charge != charges[key][0].id {
				violate(fmt.Sprintf("one external effect: %s answered 201 with charge %q, the gateway made %v", key, p.Charge, charges[key]))
			}
		}
		if len(as) > 0 && allGaveUp(as) && len(charges[key]) > 0 {
			s.SettledWithoutClient++
		}
	}
}

// allGaveUp reports whether no answer of an operation was final: its client
// gave up (or was left with a 502/503).
func allGaveUp(as []answer) bool {
	for _, a := range as {
		if a.status == http.StatusCreated || a.status == http.StatusPaymentRequired {
			return false
		}
	}
	return true
}

// awaitReconcilePasses waits until the reconciler daemon p has made n more
// full passes (onceonly_reconcile_passes_total{result="ok"}), for up to
// timeout, and reports whether it did.
func awaitReconcilePasses(p *proc, n int, timeout time.Duration) bool {
	passes := func() int {
		res, err := p.get("/metrics")
		if err != nil {
			return -1
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return -1
		}
		for line := range strings.SplitSeq(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, `onceonly_reconcile_passes_total{result="ok"} `); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return int(f)
			}
		}
		return 0
	}
	start := -1
	return settle(timeout, func() bool {
		if start < 0 {
			start = passes()
			return false
		}
		return passes() >= start+n
	})
}

// settle polls cond for up to timeout and reports whether it held.
func settle(timeout time.Duration, cond func() bool) bool {
	return oncetest.Poll(timeout, cond)
}
