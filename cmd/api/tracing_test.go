package main

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/testotlp"
	"github.com/onceonly/onceonly/oncetest"
)

// TestDaemonsExportTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, the api,
// the gateway and the relay export their spans over OTLP/HTTP; a payment
// sent with a traceparent is one trace across the api's request, the
// engine's execution and step, and the gateway's charge; the relay's
// batches and the reconciler's passes are spans of their own.
func TestDaemonsExportTraces(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	api := binary(t, ".")
	gw := binary(t, "../gateway")
	relay := binary(t, "../relay")
	reconciler := binary(t, "../reconciler")
	col := testotlp.NewOTLPCollector(t)
	dbURL := oncetest.DatabaseURL(t)
	_, prefix := oncetest.Redis(t)
	redisURL := "REDIS_URL=" + oncetest.RedisURL(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_BSP_SCHEDULE_DELAY=50"}
	g := oncetest.StartDaemon(t, gw, append(otel, "DATABASE_URL="+dbURL)...)
	a := oncetest.StartDaemon(t, api, append(otel, "DATABASE_URL="+dbURL, redisURL, "REDIS_PREFIX="+prefix, "GATEWAY_URL=http://"+g.Addr)...)
	oncetest.StartDaemon(t, relay, append(otel, "DATABASE_URL="+dbURL, redisURL, "REDIS_PREFIX="+prefix, "RELAY_POLL_INTERVAL=50ms")...)

	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequestWithContext(oncetest.Context(t), http.MethodPost, "http://"+a.Addr+"/v1/payments",
		strings.NewReader(`{"amount":700,"currency":"eur","customer":"cus_t","source":"tok_visa"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", "traced-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusCreated, res.StatusCode)

	inTrace := func(service, name string) bool {
		for _, s := range col.Find(service, name) {
			if s.TraceID == trace {
				return true
			}
		}
		return false
	}
	defer func() {
		if t.Failed() {
			for _, s := range col.Spans() {
				t.Logf("%s %s %s", s.Service, s.Name, s.TraceID)
			}
		}
	}()
	oncetest.Eventually(t, 10*time.Second, "the payment's spans", func() bool {
		return inTrace("onceonly-api", "POST /v1/payments") && inTrace("onceonly-api", "onceonly.execute") &&
			inTrace("onceonly-api", "onceonly.step") && inTrace("onceonly-gateway", "POST /v1/charges")
	})
	oncetest.Eventually(t, 10*time.Second, "a relay batch span", func() bool {
		return len(col.Find("onceonly-relay", "onceonly.relay.batch")) > 0
	})
	pass := exec.CommandContext(oncetest.Context(t), reconciler, "--once")
	pass.Env = append(append(os.Environ(), otel...), "DATABASE_URL="+dbURL, redisURL, "REDIS_PREFIX="+prefix)
	out, err := pass.CombinedOutput()
	require.NoError(t, err, string(out))
	require.NotEmpty(t, col.Find("onceonly-reconciler", "onceonly.reconcile.pass"), "flushed before the command exits")
}
