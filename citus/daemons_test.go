package citus

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/reconcile"
)

// TestOnceCommands runs payments through an api on Citus, stops it, then
// runs `relay --once` and `reconciler --once` as an operator would: both
// exit 0, the relay drains the outbox and the reconciler finds every key in
// sync. A second reconciler pass finds nothing to repair either.
func TestOnceCommands(t *testing.T) {
	s := newStack(t)
	gw := s.start(t, "gateway", "gateway")
	api := s.start(t, "api", "api", "GATEWAY_URL="+baseURL(gw))
	const payments = 40
	pay(t, api, "once", payments)
	if err := api.Stop(); err != nil {
		t.Fatal(err)
	}

	var relayed struct {
		Published int `json:"published"`
	}
	out := s.run(t, "relay", "--once")
	if err := json.Unmarshal([]byte(out), &relayed); err != nil {
		t.Fatalf("relay --once printed %q: %v", out, err)
	}
	t.Logf("relay --once: %s", out)
	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, s.db)
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&pending); err != nil {
		t.Fatalf("count the outbox: %v", err)
	}
	if pending != 0 {
		t.Errorf("relay --once left %d events in the outbox", pending)
	}

	for pass := 1; pass <= 2; pass++ {
		out := s.run(t, "reconciler", "--once")
		t.Logf("reconciler --once (pass %d): %s", pass, out)
		var rep reconcile.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("reconciler --once printed %q: %v", out, err)
		}
		if rep.Scanned < payments || rep.InSync != rep.Scanned || rep.Drift() != 0 || rep.Repaired != 0 ||
			rep.Unreachable != 0 || rep.Skipped {
			t.Errorf("pass %d: want all %d+ keys scanned and in sync, nothing repaired: %+v", pass, payments, rep)
		}
	}
}

// pay sends n payments (keys name-0 … name-n-1, cards that charge) to api
// and fails the test unless each is created (201).
func pay(t *testing.T, api *oncetest.Daemon, name string, n int) {
	t.Helper()
	ctx := oncetest.Context(t)
	c := &client.Client{HTTP: &http.Client{Timeout: 10 * time.Second}, MaxAttempts: 10}
	for i := range n {
		res, err := c.Do(ctx, client.Request{Method: "POST", URL: baseURL(api) + "/v1/payments",
			Key:    fmt.Sprintf("%s-%d", name, i),
			Body:   fmt.Appendf(nil, `{"amount":%d,"currency":"eur","customer":"cus_%d","source":"tok_visa"}`, 100+i, i),
			Header: http.Header{"Authorization": {"Bearer sk_test_demo"}}}) // the api's demo key when API_KEYS is unset
		if err != nil {
			t.Fatalf("payment %d: %v", i, err)
		}
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("payment %d: %d %s", i, res.StatusCode, res.Body)
		}
	}
}
