package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/oncetest"
)

// The network-fault test (issue 24): two api processes, each with its
// in-process gateway on its own Postgres, reach Postgres and Redis through
// fault proxies (oncetest.FaultProxy). Payments are sent by clients that
// retry while, phase by phase, Postgres goes down (connections reset), is
// cut off (a blackhole) or slow (latency), Redis goes down or is cut off,
// and one api is killed (SIGKILL). Each phase has keys of its own, so the
// time from the fault's end to each key's final answer is measured per
// fault kind.
const (
	nfLease     = 3 * time.Second
	nfResume    = 300 * time.Millisecond
	nfSlowDelay = time.Second
	// nfFaultHold is how long a network fault lasts.
	nfFaultHold = 2500 * time.Millisecond
	// nfLatency is the delay added to each chunk, either way, in
	// pg_latency.
	nfLatency = 50 * time.Millisecond
	// nfVisaKeys and nfSlowKeys are each phase's payments; every key is sent
	// by two or three clients at once.
	nfVisaKeys = 30
	nfSlowKeys = 5
	// nfSettleLimit is how long after a fault clears a client goes on
	// retrying: by then every key must have its final answer.
	nfSettleLimit = 10 * time.Second
	// nfAttemptTimeout bounds one request of a client.
	nfAttemptTimeout = 5 * time.Second
)

// nfPhase is one fault kind's run: its keys, the moment its fault cleared
// and what the clients saw.
type nfPhase struct {
	name string

	mu        sync.Mutex
	clearedAt time.Time            // zero while the fault lasts
	firstSent map[string]time.Time // key → when its first request went out
	answered  map[string][]nfFinal // key → one final answer per client
	statuses  map[string]int       // status (or "transport_error") → count
}

// nfFinal is how one client's retries ended.
type nfFinal struct {
	at      time.Time // when the 201 came (zero: it never came)
	payment string    // the answer's payment id
	charge  string    // and charge id
	last    string    // the last answer, when it was not a 201
}

func (p *nfPhase) cleared() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clearedAt, !p.clearedAt.IsZero()
}

// nfRun is the whole test's shared state: the api addresses clients pick
// from, the violations found, and when each key's payment row appeared.
type nfRun struct {
	http *http.Client

	mu         sync.Mutex
	apis       []string // api addresses; a killed api's is replaced by its successor's
	violations []string
	committed  map[string]time.Time // key → when its payments row was first seen
}

func (r *nfRun) api(i int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apis[i%len(r.apis)]
}

func (r *nfRun) violatef(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func (r *nfRun) committedAt(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.committed[key]
	return at, ok
}

// TestNetworkFaults asserts, under each fault: no 502 (the gateway is on
// the api's own Postgres, so a Postgres failure is a 503), every 409 and
// 503 carries Retry-After, every client gets its 201 within 10 s of the
// fault's end (retrying about once a second), all with the same payment,
// and each key has one charge and one payment row with that charge; no 503
// while only Redis is down (Redis is only a cache), and no data race in the
// apis (built with -race). It logs the settlement times per fault kind, and
// one JSON line of them.
func TestNetworkFaults(t *testing.T) {
	began := time.Now()
	apiBin := oncetest.BuildBinary(t, "../cmd/api")
	dbURL := oncetest.DatabaseURL(t)
	_, prefix := oncetest.Redis(t)
	pgProxy, pgURL := oncetest.NewFaultProxyFor(t, dbURL)
	redisProxy, redisURL := oncetest.NewFaultProxyFor(t, oncetest.RedisURL(t))
	pool := oncetest.Pool(t, dbURL) // direct: the test's own reads see no fault
	ctx := oncetest.ContextFor(t, 2*time.Minute)

	env := []string{"DATABASE_URL=" + pgURL, "REDIS_URL=" + redisURL, "REDIS_PREFIX=" + prefix,
		"GATEWAY_URL=", "API_KEYS=", "LEASE_TIMEOUT=" + nfLease.String(), "RESUME_INTERVAL=" + nfResume.String(),
		"SLOW_GATEWAY_DELAY=" + nfSlowDelay.String()}
	daemons := []*oncetest.Daemon{oncetest.StartDaemon(t, apiBin, env...), oncetest.StartDaemon(t, apiBin, env...)}
	run := &nfRun{
		http: &http.Client{Timeout: nfAttemptTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		apis: []string{daemons[0].Addr, daemons[1].Addr}, committed: map[string]time.Time{},
	}
	t.Cleanup(run.http.CloseIdleConnections)
	stopPolling := run.pollCommits(ctx, pool)
	t.Cleanup(stopPolling)

	phases := []struct {
		name  string
		fault func() time.Time // injects the fault, ends it, and returns when it ended
	}{
		{"pg_down", func() time.Time { return hold(pgProxy, oncetest.Reset) }},
		{"pg_blackhole", func() time.Time { return hold(pgProxy, oncetest.Blackhole) }},
		{"pg_latency", func() time.Time {
			pgProxy.SetLatency(nfLatency)
			time.Sleep(nfFaultHold) // the fault's length
			pgProxy.SetMode(oncetest.Pass)
			return time.Now()
		}},
		{"redis_down", func() time.Time { return hold(redisProxy, oncetest.Reset) }},
		{"redis_blackhole", func() time.Time { return hold(redisProxy, oncetest.Blackhole) }},
		{"api_kill", func() time.Time {
			// The kill is the whole fault: what the dead api held is
			// settled after its lease, by the other api or a retry.
			killed := daemons[0]
			_ = killed.Cmd.Process.Kill()
			at := time.Now()
			_ = killed.Cmd.Wait()
			daemons = append(daemons, oncetest.StartDaemon(t, apiBin, env...))
			run.mu.Lock()
			run.apis[0] = daemons[len(daemons)-1].Addr
			run.mu.Unlock()
			return at
		}},
	}
	t.Logf("setup took %s", time.Since(began).Round(10*time.Millisecond))
	var done []*nfPhase
	defer func() {
		if t.Failed() {
			run.mu.Lock()
			violations := slices.Clone(run.violations)
			run.mu.Unlock()
			dumpLogs(t, daemons, violations)
		}
	}()
	for _, ph := range phases {
		for _, d := range run.apis {
			oncetest.WaitReady(t, d)
		}
		began := time.Now()
		p := run.runPhase(t, ctx, pool, ph.name, ph.fault)
		t.Logf("%s: the phase took %s", ph.name, time.Since(began).Round(10*time.Millisecond))
		done = append(done, p)
		if t.Failed() {
			break
		}
	}
	run.checkRows(ctx, pool, done)
	for _, p := range done {
		if strings.HasPrefix(p.name, "redis_") && p.statuses["503"] > 0 {
			// Redis is only a cache: without Redis the api serves from
			// Postgres.
			run.violatef("%s: %d answers were 503 while only Redis was down", p.name, p.statuses["503"])
		}
	}
	for i, d := range daemons {
		if logs := d.Logs.String(); strings.Contains(logs, "DATA RACE") {
			at := strings.Index(logs, "WARNING: DATA RACE")
			run.violatef("api %d (%s) reported a data race:\n%s", i, d.Addr, logs[max(0, at):min(len(logs), max(0, at)+3000)])
		}
	}
	report(t, run, done)
	for i, v := range run.violations {
		if i == 30 {
			t.Errorf("… and %d more violations", len(run.violations)-30)
			break
		}
		t.Error(v)
	}
}

// hold puts proxy in mode for nfFaultHold, then back to Pass, and returns
// when it did.
func hold(proxy *oncetest.FaultProxy, mode oncetest.FaultMode) time.Time {
	proxy.SetMode(mode)
	time.Sleep(nfFaultHold) // the fault's length, not a wait for an event
	proxy.SetMode(oncetest.Pass)
	return time.Now()
}

// runPhase sends the phase's payments, injects its fault once the slow
// payments are in flight at the gateway, and returns when every client has
// its answer or gave up, nfSettleLimit after the fault ended.
func (r *nfRun) runPhase(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, fault func() time.Time) *nfPhase {
	t.Helper()
	p := &nfPhase{name: name, firstSent: map[string]time.Time{}, answered: map[string][]nfFinal{}, statuses: map[string]int{}}
	var wg sync.WaitGroup
	start := time.Now()
	// The slow payments go first, each to the first api (the one killed in
	// api_kill), a duplicate to the other shortly after.
	slowRefs := make([]string, 0, nfSlowKeys)
	for i := range nfSlowKeys {
		key := fmt.Sprintf("nf-%s-slow-%d", name, i)
		slowRefs = append(slowRefs, "acct_demo/"+key)
		body := fmt.Sprintf(`{"amount":%d,"currency":"eur","customer":"cus_nf","source":"tok_slow"}`, 500+i)
		for j := range 2 {
			wg.Go(func() { r.client(ctx, p, key, "tok_slow", body, j, start.Add(time.Duration(j)*200*time.Millisecond)) })
		}
	}
	// The tok_visa payments start all through the fault, so some are in
	// flight when it begins, most are sent while it lasts and a few after.
	spacing := (nfFaultHold + 500*time.Millisecond) / nfVisaKeys
	for i := range nfVisaKeys {
		key := fmt.Sprintf("nf-%s-visa-%d", name, i)
		body := fmt.Sprintf(`{"amount":%d,"currency":"eur","customer":"cus_nf","source":"tok_visa"}`, 100+i)
		at := start.Add(time.Duration(i) * spacing)
		for j := range 2 + i%2 {
			jitter := time.Duration(rand.IntN(50)) * time.Millisecond
			wg.Go(func() { r.client(ctx, p, key, "tok_visa", body, i+j, at.Add(jitter)) })
		}
	}
	oncetest.Eventually(t, 30*time.Second, name+": the slow payments in flight at the gateway", func() bool {
		var calls, processing int
		err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'processing') FROM gateway.charges
			WHERE reference = ANY($1)`, slowRefs).Scan(&calls, &processing)
		return err == nil && calls == nfSlowKeys && processing > 0
	})
	at := fault()
	p.mu.Lock()
	p.clearedAt = at
	p.mu.Unlock()
	wg.Wait()
	return p
}

// client sends one payment from at on, to api first (then to the next api
// on each retry), until it gets its final answer (201) or nfSettleLimit
// has passed since the phase's fault ended. It retries a 409, a 5xx or no
// answer after the Retry-After (at most 1 s), else after 300–500 ms.
func (r *nfRun) client(ctx context.Context, p *nfPhase, key, source, body string, api int, at time.Time) {
	var final nfFinal
	defer func() {
		p.mu.Lock()
		p.answered[key] = append(p.answered[key], final)
		p.mu.Unlock()
	}()
	if !sleepUntil(ctx, at) {
		return
	}
	p.mu.Lock()
	if first, ok := p.firstSent[key]; !ok || time.Now().Before(first) {
		p.firstSent[key] = time.Now()
	}
	p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		addr := r.api(api + attempt)
		status, header, answer, err := r.post(ctx, addr, key, body)
		label := strconv.Itoa(status)
		if err != nil {
			label = "transport_error"
		}
		p.mu.Lock()
		p.statuses[label]++
		p.mu.Unlock()
		when := time.Now().Format("15:04:05.000")
		switch {
		case status == http.StatusCreated:
			var pay struct {
				ID     string `json:"id"`
				Charge string `json:"charge"`
			}
			if err := json.Unmarshal([]byte(answer), &pay); err != nil || pay.ID == "" || pay.Charge == "" {
				r.violatef("%s: %s (%s) answered 201 without a payment id and charge at %s: %s", p.name, key, source, when, answer)
			}
			final = nfFinal{at: time.Now(), payment: pay.ID, charge: pay.Charge}
			return
		case status == http.StatusBadGateway:
			r.violatef("%s: 502 for %s (%s) from %s at %s: %s", p.name, key, source, addr, when, answer)
		case status == http.StatusConflict || status == http.StatusServiceUnavailable:
			if _, err := strconv.Atoi(header.Get("Retry-After")); err != nil {
				r.violatef("%s: %d for %s (%s) from %s at %s without a Retry-After in whole seconds (%q): %s",
					p.name, status, key, source, addr, when, header.Get("Retry-After"), answer)
			}
		case err != nil:
		case status >= 500:
			r.violatef("%s: %d for %s (%s) from %s at %s: %s", p.name, status, key, source, addr, when, answer)
		default: // a 4xx other than 409 is final: retrying would not help
			r.violatef("%s: %d for %s (%s) from %s at %s: %s", p.name, status, key, source, addr, when, answer)
			final.last = label + " " + answer
			return
		}
		final.last = label + " " + answer
		if err != nil {
			final.last = err.Error()
		}
		if clearedAt, ok := p.cleared(); ok && time.Since(clearedAt) > nfSettleLimit {
			return
		}
		wait := time.Duration(300+rand.IntN(200)) * time.Millisecond
		if s, err := strconv.Atoi(header.Get("Retry-After")); err == nil {
			wait = min(time.Duration(s)*time.Second, time.Second)
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return
		}
	}
}

// post sends one payment and returns its answer; err is set when none came.
func (r *nfRun) post(ctx context.Context, addr, key, body string) (int, http.Header, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := r.http.Do(req)
	if err != nil {
		return 0, http.Header{}, "", err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, http.Header{}, "", err
	}
	return res.StatusCode, res.Header, string(raw), nil
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// pollCommits notes when each payments row first appears (every 50 ms,
// straight from Postgres) until the returned function is called.
func (r *nfRun) pollCommits(ctx context.Context, pool *pgxpool.Pool) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			rows, err := pool.Query(ctx, `SELECT idempotency_key FROM payments WHERE merchant_id = 'acct_demo'`)
			if err == nil {
				now := time.Now()
				for rows.Next() {
					var key string
					if rows.Scan(&key) == nil {
						r.mu.Lock()
						if _, seen := r.committed[key]; !seen {
							r.committed[key] = now
						}
						r.mu.Unlock()
					}
				}
				rows.Close()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// checkRows checks every key of the phases in Postgres: one charge at the
// gateway, with a charge id, and one payment row with that charge, the
// one every client was answered with.
func (r *nfRun) checkRows(ctx context.Context, pool *pgxpool.Pool, phases []*nfPhase) {
	type rowsOf struct {
		n       int
		charges []string
	}
	read := func(query string) map[string]rowsOf {
		out := map[string]rowsOf{}
		rows, err := pool.Query(ctx, query)
		if err != nil {
			r.violatef("read the rows: %v", err)
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var key, charge string
			if err := rows.Scan(&key, &charge); err != nil {
				r.violatef("read the rows: %v", err)
				return out
			}
			o := out[key]
			o.n++
			o.charges = append(o.charges, charge)
			out[key] = o
		}
		return out
	}
	gateway := read(`SELECT split_part(reference, '/', 2), coalesce(charge_id, '') FROM gateway.charges WHERE reference LIKE 'acct_demo/nf-%'`)
	paid := read(`SELECT idempotency_key, coalesce(charge_id, '') FROM payments WHERE merchant_id = 'acct_demo' AND status = 'succeeded'`)
	var other int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE status <> 'succeeded'`).Scan(&other); err != nil || other != 0 {
		r.violatef("payments that did not succeed: %d (%v)", other, err)
	}
	for _, p := range phases {
		for key, finals := range p.answered {
			g, row := gateway[key], paid[key]
			if g.n != 1 || g.charges[0] == "" {
				r.violatef("%s: %s has %d gateway charges, ids %q (want one, with a charge id)", p.name, key, g.n, g.charges)
			}
			if row.n != 1 || g.n == 1 && row.charges[0] != g.charges[0] {
				r.violatef("%s: %s has %d payment rows, charges %q (the gateway charged %q)", p.name, key, row.n, row.charges, g.charges)
			}
			ids := map[string]bool{}
			for _, f := range finals {
				if f.at.IsZero() {
					r.violatef("%s: a client of %s had no final answer %s after the fault ended; its last: %s", p.name, key, nfSettleLimit, f.last)
					continue
				}
				ids[f.payment+" "+f.charge] = true
				if g.n == 1 && f.charge != g.charges[0] {
					r.violatef("%s: %s was answered charge %s, the gateway charged %s", p.name, key, f.charge, g.charges[0])
				}
			}
			if len(ids) > 1 {
				r.violatef("%s: the clients of %s were answered different payments: %v", p.name, key, ids)
			}
		}
	}
}

// nfFigures are one phase's settlement figures, in seconds from the
// fault's end.
type nfFigures struct {
	Keys int `json:"keys"`
	// Open is the keys sent before the fault ended some client of which
	// had no 201 yet when it did; AnswerP50/AnswerMax is when their last
	// client got it.
	Open      int     `json:"open_at_clear"`
	AnswerP50 float64 `json:"answer_p50_s"`
	AnswerMax float64 `json:"answer_max_s"`
	// Committed is those of the Open keys whose payment row appeared after
	// the fault ended; CommitP50/CommitMax is when.
	Committed int            `json:"committed_after_clear"`
	CommitP50 float64        `json:"commit_p50_s"`
	CommitMax float64        `json:"commit_max_s"`
	Statuses  map[string]int `json:"statuses"`
}

// report logs each phase's settlement figures, then all of them as one
// JSON line.
func report(t *testing.T, r *nfRun, phases []*nfPhase) {
	t.Helper()
	all := map[string]nfFigures{}
	for _, p := range phases {
		f := nfFigures{Keys: len(p.answered), Statuses: p.statuses}
		var answers, commits []float64
		slowest, slowestAt := "", time.Duration(0)
		for key, finals := range p.answered {
			last := time.Time{}
			for _, fin := range finals {
				if fin.at.IsZero() {
					last = time.Time{}
					break
				}
				if fin.at.After(last) {
					last = fin.at
				}
			}
			if !p.firstSent[key].Before(p.clearedAt) || !last.IsZero() && last.Before(p.clearedAt) {
				continue // sent after the fault, or settled before it ended
			}
			f.Open++
			if !last.IsZero() {
				answers = append(answers, last.Sub(p.clearedAt).Seconds())
			}
			if at, ok := r.committedAt(key); ok && at.After(p.clearedAt) {
				commits = append(commits, at.Sub(p.clearedAt).Seconds())
				if at.Sub(p.clearedAt) > slowestAt {
					slowest, slowestAt = key, at.Sub(p.clearedAt)
				}
			}
		}
		f.Committed = len(commits)
		f.AnswerP50, f.AnswerMax = quantiles(answers)
		f.CommitP50, f.CommitMax = quantiles(commits)
		all[p.name] = f
		t.Logf("%-15s keys %d; open when the fault ended %d, their last client answered p50 %.2fs max %.2fs; "+
			"committed after it %d, p50 %.2fs max %.2fs (%s); answers %v",
			p.name, f.Keys, f.Open, f.AnswerP50, f.AnswerMax, f.Committed, f.CommitP50, f.CommitMax, slowest, f.Statuses)
	}
	line, err := json.Marshal(all)
	if err != nil {
		t.Errorf("encode the figures: %v", err)
		return
	}
	t.Logf("netfault settlement: %s", line)
}

// quantiles returns the median and the maximum of xs (zeros when empty),
// rounded to 10 ms.
func quantiles(xs []float64) (p50, maxX float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	sort.Float64s(xs)
	round := func(x float64) float64 { return float64(int(x*100+0.5)) / 100 }
	return round(xs[len(xs)/2]), round(xs[len(xs)-1])
}

// dumpLogs logs what the apis said about the first keys the violations
// name, and the end of each api's log.
func dumpLogs(t *testing.T, daemons []*oncetest.Daemon, violations []string) {
	t.Helper()
	var keys []string
	for _, v := range violations {
		for word := range strings.FieldsSeq(v) {
			if strings.HasPrefix(word, "nf-") && !slices.Contains(keys, word) && len(keys) < 5 {
				keys = append(keys, word)
			}
		}
	}
	for i, d := range daemons {
		lines := strings.Split(d.Logs.String(), "\n")
		for _, key := range keys {
			var about []string
			for _, l := range lines {
				if strings.Contains(l, "key="+key+" ") || strings.HasSuffix(l, "key="+key) {
					about = append(about, l)
				}
			}
			if len(about) > 0 {
				t.Logf("--- api %d (%s) on %s:\n%s", i, d.Addr, key, strings.Join(about[max(0, len(about)-20):], "\n"))
			}
		}
		t.Logf("--- api %d (%s) log tail:\n%s", i, d.Addr, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}
