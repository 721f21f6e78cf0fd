package citus

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/reconcile"
)

// merchants are the chaos run's tenants: their keys lie on several shards.
const merchants = 8

// TestChaos sends every payment two to four times, two copies at once to
// two api processes, while an api is killed with SIGKILL and Redis is
// flushed now and then, on a system whose DATABASE_URL is the coordinator.
// Then: every copy got the same final answer, each key made one payment
// (no duplicate row), the outbox drains (two relays, one listening, one
// polling) and a reconciler pass finds every key in sync.
// CITUS_CHAOS_PAYMENTS (default 200) and CITUS_CHAOS_DURATION (default 15s)
// size the run.
func TestChaos(t *testing.T) {
	payments := oncetest.EnvInt(t, "CITUS_CHAOS_PAYMENTS", 200)
	duration := 15 * time.Second
	if v := os.Getenv("CITUS_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CITUS_CHAOS_DURATION=%q: want a positive duration", v)
		}
		duration = d
	}
	rds := oncetest.NewRedisServer(t)
	s := newStack(t, "REDIS_URL="+rds.URL())
	keys := make([]string, merchants)
	for i := range keys {
		keys[i] = fmt.Sprintf("sk_chaos%d=acct_chaos%d", i, i)
	}
	gw := s.start(t, "gateway", "gateway", "SLOW_GATEWAY_DELAY=300ms")
	apiEnv := []string{"GATEWAY_URL=" + baseURL(gw), "LEASE_TIMEOUT=3s", "RESUME_INTERVAL=300ms", "API_KEYS=" + strings.Join(keys, ",")}
	apis := []*oncetest.Daemon{s.start(t, "api1", "api", apiEnv...), s.start(t, "api2", "api", apiEnv...)}
	relays := []*oncetest.Daemon{
		s.start(t, "relay1", "relay", "RELAY_POLL_INTERVAL=200ms", "DATABASE_SESSION_URL="+s.db),
		s.start(t, "relay2", "relay", "RELAY_POLL_INTERVAL=200ms"),
	}
	reconciler := s.start(t, "reconciler", "reconciler", "RECONCILE_SCHEDULE=@every 1s", "REAP_GRACE=100ms")

	ctx := oncetest.ContextFor(t, 2*duration+3*time.Minute)
	loadCtx, endLoad := context.WithCancel(ctx)
	faults := map[string]int{}
	var faultErrs []string
	faultsDone := make(chan struct{})
	rdb := rds.Client(t)
	go func() {
		defer close(faultsDone)
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-time.After(time.Duration(700+rand.IntN(800)) * time.Millisecond):
			}
			if rand.IntN(3) == 0 {
				if rdb.FlushAll(ctx).Err() == nil {
					faults["flushall"]++
				}
				continue
			}
			api := apis[rand.IntN(len(apis))]
			api.Kill()
			faults["kill_api"]++
			if err := api.Restart(); err != nil {
				faultErrs = append(faultErrs, err.Error())
			}
		}
	}()
	answers := chaosLoad(ctx, apis, payments, duration)
	endLoad()
	<-faultsDone
	t.Logf("faults: %v", faults)
	for _, e := range faultErrs {
		t.Error(e)
	}
	if faults["kill_api"] == 0 || faults["flushall"] == 0 {
		t.Errorf("the run injected too few faults: %v", faults)
	}

	// Every copy of a payment ended with the same final answer.
	copies := 0
	for key, list := range answers {
		copies += len(list)
		for _, a := range list {
			switch {
			case a.err != nil:
				t.Errorf("%s: no final answer: %v", key, a.err)
			case a.status != http.StatusCreated && a.status != http.StatusPaymentRequired:
				t.Errorf("%s: final answer %d %s", key, a.status, a.body)
			case a.body != list[0].body:
				t.Errorf("%s: two answers differ:\n%s\n%s", key, list[0].body, a.body)
			}
		}
	}
	t.Logf("%d payments, %d requests with their duplicates", payments, copies)

	// One payment row per key, none twice.
	pool := oncetest.Pool(t, s.db)
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (merchant_id, idempotency_key)) FROM payments`).Scan(&rows, &distinct); err != nil {
		t.Fatalf("count the payments: %v", err)
	}
	if rows != distinct || distinct != payments {
		t.Errorf("payments: %d rows for %d keys; want %d, one each (duplicates: %d)", rows, distinct, payments, rows-distinct)
	}

	// The outbox drains.
	var pending int
	if !oncetest.Poll(60*time.Second, func() bool {
		return pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&pending) == nil && pending == 0
	}) {
		t.Errorf("the outbox did not drain within 60 s: %d events left", pending)
	}

	// The last FLUSHALL may have come after the last write: the running
	// reconciler (a pass a second) refills Redis from Postgres. Wait for a
	// pass that finds nothing to repair, then stop everything and check
	// once more.
	var last string
	if !oncetest.Poll(30*time.Second, func() bool {
		last = s.run(t, "reconciler", "--once", "--dry-run")
		var rep reconcile.Report
		return json.Unmarshal([]byte(last), &rep) == nil && rep.Drift() == 0 && rep.InSync == rep.Scanned
	}) {
		t.Errorf("Redis did not converge within 30 s of the last fault: %s", last)
	}
	for _, d := range append(append([]*oncetest.Daemon{gw, reconciler}, apis...), relays...) {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
	}
	out := s.run(t, "reconciler", "--once")
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("reconciler --once printed %q: %v", out, err)
	}
	t.Logf("reconciler --once: %s", out)
	if rep.Drift() != 0 || rep.InSync != rep.Scanned || rep.Unreachable != 0 {
		t.Errorf("a reconciler pass after the run found drift: %+v", rep)
	}
}

// answer is the final answer to one copy of a payment.
type answer struct {
	status int
	body   string
	err    error
}

// sources are the cards of the load: most charge, some are declined (402),
// some make the gateway slow (a duplicate meets the first in flight).
var sources = []string{"tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_visa", "tok_visa",
	"tok_chargeDeclined", "tok_slow", "tok_slow"}

// chaosLoad sends each of n payments two to four times over duration: the
// first two copies at once to different apis, the others a moment later.
// It returns every copy's final answer by key.
func chaosLoad(ctx context.Context, apis []*oncetest.Daemon, n int, duration time.Duration) map[string][]answer {
	c := &client.Client{HTTP: &http.Client{Timeout: 5 * time.Second}, MaxAttempts: 40,
		MinDelay: 50 * time.Millisecond, MaxDelay: 700 * time.Millisecond}
	var mu sync.Mutex
	answers := make(map[string][]answer, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		merchant := i % merchants
		key := fmt.Sprintf("chaos-%d", i)
		body := fmt.Appendf(nil, `{"amount":%d,"currency":"eur","customer":"cus_%d","source":%q}`, 100+i, i, sources[i%len(sources)])
		start := time.Duration(rand.Int64N(int64(duration * 4 / 5)))
		for j := range 2 + rand.IntN(3) {
			delay := start
			if j > 1 {
				delay += time.Duration(rand.IntN(1500)) * time.Millisecond
			}
			api := apis[(i+j)%len(apis)]
			wg.Go(func() {
				time.Sleep(delay) // the copy's place in the load's schedule
				sem <- struct{}{}
				defer func() { <-sem }()
				opCtx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				res, err := c.Do(opCtx, client.Request{Method: "POST", URL: baseURL(api) + "/v1/payments", Key: key, Body: body,
					Header: http.Header{"Authorization": {fmt.Sprintf("Bearer sk_chaos%d", merchant)}}})
				a := answer{err: err}
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
