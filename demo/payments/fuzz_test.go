package payments_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceonly/onceonly/oncetest"
)

// FuzzAPI sends arbitrary requests — method, path and query, idempotency
// key, content type, credentials and body — through the demo api's real
// handler, on real Postgres and Redis and the demo gateway. Whatever comes
// in, the api never panics and never answers a 5xx other than 502 and 503
// with Retry-After (I10). The key is varied per run so the inputs reach
// first executions, replays and reuses alike.
//
//	go test -run '^$' -fuzz FuzzAPI -fuzztime 1000000x ./demo/payments   (make fuzz)
func FuzzAPI(f *testing.F) {
	b := setup(f, setupOpts{})
	handler := b.servers[0].Config.Handler
	seeds := []struct {
		method, target, key, contentType, auth string
		body                                   string
	}{
		{"POST", "/v1/payments", "k1", "application/json", apiKey, `{"amount":100,"currency":"usd","customer":"c","source":"tok_visa"}`},
		{"POST", "/v1/payments?x=1&x=2", "k1", "application/json; charset=utf-8", apiKey, `{"amount":100,"currency":"usd","customer":"c","source":"tok_visa"}`},
		{"POST", "/v1/payments", "k2", "application/json", apiKey, `{"amount":100,"amount":5,"currency":"usd","customer":"c"}`},
		{"POST", "/v1/payments", "k3", "application/json", apiKey, `{"amount":1,"currency":"usd","customer":"a\u0000b"}`},
		{"POST", "/v1/payments", "k4", "application/json", apiKey, "{\"amount\":1,\"currency\":\"usd\",\"customer\":\"\xff\"}"},
		{"POST", "/v1/payments", "k5", "application/json", apiKey, `{"amount":1,"currency":"usd","customer":"\ud800"}`},
		{"POST", "/v1/payments", "k6", "application/json", apiKey, `{"amount":1e400,"currency":"usd","customer":"c","source":"tok_gatewayError"}`},
		{"POST", "/v1/payments", "k7", "text/plain", apiKey, `amount=1`},
		{"POST", "/v1/payments", "", "application/json", apiKey, `{}`},
		{"POST", "/v1/payments", "k8", "application/json", "sk_wrong", `{}`},
		{"GET", "/v1/payments/pay_1", "", "", apiKey, ``},
		{"DELETE", "/v1/payments", "k9", "", apiKey, ``},
		{"POST", "/v1/payments", strings.Repeat("k", 256), "application/json", apiKey, `[]`},
		{"POST", "/v1/payments", "k10", "application/json", apiKey, `{"amount":-1,"currency":"usd","customer":"c","description":null,"metadata":{"a":[1,{"b":2}]}}`},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.key, s.contentType, s.auth, []byte(s.body))
	}
	run := oncetest.RandomSuffix(6) // keys of this run do not meet those of an earlier one in the shared Redis
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, method, target, key, contentType, auth string, body []byte) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		req, err := http.NewRequestWithContext(b.ctx, method, "http://api"+target, bytes.NewReader(body))
		if err != nil {
			return // not a request an HTTP server would hand the api
		}
		if key != "" {
			if n.Add(1)%2 == 0 {
				key = run + key // half the keys are fresh, half meet earlier ones
			}
			req.Header.Set("Idempotency-Key", key)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		req.Header.Set("Authorization", "Bearer "+auth)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		switch status := rec.Code; {
		case status < 500, status == http.StatusBadGateway:
		case status == http.StatusServiceUnavailable && rec.Header().Get("Retry-After") != "":
		default:
			t.Fatalf("%s %q key %q type %q: %d %s", method, target, key, contentType, status, rec.Body.String())
		}
	})
}
