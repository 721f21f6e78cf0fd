package main

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

func TestBadConfiguration(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}
	oncetest.RequireRejections(t, run, []oncetest.Rejection{
		{Env: oncetest.EnvWith(base, "DATABASE_URL", ""), Want: "DATABASE_URL (or -database-url) is required"},
		{Env: oncetest.EnvWith(base, "DATABASE_URL", "mysql://x y"), Want: "DATABASE_URL"},
		{Env: oncetest.EnvWith(base, "GATEWAY_FAULTS", "charge_then_boom=0.1"), Want: `GATEWAY_FAULTS="charge_then_boom=0.1": "charge_then_boom": unknown fault mode`},
		{Env: oncetest.EnvWith(base, "GATEWAY_FAULTS", "charge_then_500=2"), Want: "the probability must be a number from 0 to 1"},
		{Env: oncetest.EnvWith(base, "GATEWAY_FAULTS", "charge_then_500"), Want: "want mode=probability"},
		{Env: oncetest.EnvWith(base, "GATEWAY_FAULTS", "charge_then_500=0.6,fail_before_charge=0.6"), Want: "add up to more than 1"},
		{Env: base, Args: []string{"-gateway-faults", "charge_then_hang=x"}, Want: "GATEWAY_FAULTS"},
		{Env: oncetest.EnvWith(base, "GATEWAY_LATENCY", "fast"), Want: `GATEWAY_LATENCY="fast": not a duration`},
		{Env: oncetest.EnvWith(base, "GATEWAY_LATENCY", "-1s"), Want: `GATEWAY_LATENCY="-1s": must not be negative`},
		{Env: oncetest.EnvWith(base, "SLOW_GATEWAY_DELAY", "2"), Want: `SLOW_GATEWAY_DELAY="2": not a duration`},
		{Env: oncetest.EnvWith(base, "SLOW_GATEWAY_DELAY", "0s"), Want: "SLOW_GATEWAY_DELAY must be positive"},
		{Env: oncetest.EnvWith(base, "GATEWAY_HANG", "forever"), Want: `GATEWAY_HANG="forever": not a duration`},
		{Env: oncetest.EnvWith(base, "GATEWAY_HANG", "0s"), Want: "GATEWAY_HANG must be positive"},
		{Env: oncetest.EnvWith(base, "LOG_LEVEL", "loud"), Want: `LOG_LEVEL="loud"`},
		{Env: oncetest.EnvWith(base, "LOG_FORMAT", "xml"), Want: `LOG_FORMAT="xml"`},
		{Env: oncetest.EnvWith(base, "HTTP_ADDR", " "), Want: "HTTP_ADDR must not be empty"},
		{Env: base, Args: []string{"--redis-url", "redis://x"}, Want: "flag provided but not defined: -redis-url"},
		{Env: base, Args: []string{"serve"}, Want: `unexpected argument "serve"`},
	})
}

func TestHelpListsEverySetting(t *testing.T) {
	code, stdout, stderr := oncetest.RunMain(t, run, nil, "-h")
	require.Equal(t, 0, code)
	require.Empty(t, stdout)
	for _, want := range []string{
		"usage: gateway", "-database-url", "DATABASE_URL", "-http-addr", "HTTP_ADDR", ":8083",
		"-gateway-latency", "GATEWAY_LATENCY", "-slow-gateway-delay", "SLOW_GATEWAY_DELAY", "2s",
		"-gateway-faults", "GATEWAY_FAULTS", "charge_then_500", "charge_then_hang", "charge_then_reset", "fail_before_charge",
		"-gateway-hang", "GATEWAY_HANG", "30s", "-log-level", "LOG_LEVEL", "-log-format", "LOG_FORMAT",
	} {
		require.Contains(t, stderr, want)
	}
	require.NotContains(t, stderr, "REDIS", "the gateway has no Redis")
}

func TestConfigurationIsDocumented(t *testing.T) {
	oncetest.RequireDocumented(t, run)
}

func TestUnreachablePostgres(t *testing.T) {
	code, stdout, stderr := oncetest.RunMain(t, run, map[string]string{
		"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", "HTTP_ADDR": oncetest.FreeAddr(t),
	})
	require.Equal(t, 1, code)
	oncetest.RequireOneLineError(t, code, stdout, stderr, "connect to Postgres")
}

// TestDaemon runs the gateway binary: it migrates its schema, charges once
// per key, serves its ops endpoints, and exits 0 soon after SIGTERM.
func TestDaemon(t *testing.T) {
	bin := oncetest.BuildBinary(t, ".")
	dbURL := oncetest.EmptyDatabaseURL(t)
	d := oncetest.StartDaemon(t, bin, "DATABASE_URL="+dbURL, "SLOW_GATEWAY_DELAY=300ms")

	ctx := oncetest.Context(t)
	c := &gateway.Client{BaseURL: "http://" + d.Addr}
	req := gateway.ChargeRequest{Amount: 1999, Currency: "usd", Source: "tok_slow", Reference: "acct_demo/order-7"}
	began := time.Now()
	ch, err := c.Charge(ctx, "daemon-key", req)
	require.NoError(t, err, d.Logs.String())
	require.Equal(t, "succeeded", ch.Status)
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
	again, err := c.Charge(ctx, "daemon-key", req)
	require.NoError(t, err)
	require.Equal(t, ch, again)
	list, err := c.Lookup(ctx, "acct_demo/order-7")
	require.NoError(t, err)
	require.Equal(t, []gateway.Charge{ch}, list.Data)

	body := get(t, "http://"+d.Addr+"/metrics")
	for _, metric := range []string{`gateway_charges_total{status="succeeded"} 1`, `gateway_requests_total{code="201"} 2`,
		`gateway_requests_total{code="200"} 1`, `gateway_faults_total{mode="charge_then_hang"} 0`, "go_goroutines"} {
		require.Contains(t, body, metric)
	}
	require.Contains(t, get(t, "http://"+d.Addr+"/healthz"), `"ok"`)
	require.Contains(t, get(t, "http://"+d.Addr+"/readyz"), `"postgres":"ok"`)

	start := time.Now()
	require.NoError(t, d.Cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.Cmd.Wait(), d.Logs.String())
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, d.Logs.String(), "gateway started")
}

// TestDaemonShutdownCutsAHangingCall: SIGTERM with a charge_then_hang call
// in flight (GATEWAY_HANG an hour) ends the call and the process at once.
func TestDaemonShutdownCutsAHangingCall(t *testing.T) {
	bin := oncetest.BuildBinary(t, ".")
	dbURL := oncetest.EmptyDatabaseURL(t)
	d := oncetest.StartDaemon(t, bin, "DATABASE_URL="+dbURL, "GATEWAY_FAULTS=charge_then_hang=1", "GATEWAY_HANG=1h")

	ctx := oncetest.Context(t)
	c := &gateway.Client{BaseURL: "http://" + d.Addr}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, "daemon-hang", gateway.ChargeRequest{Amount: 1, Currency: "usd", Source: "tok_visa", Reference: "a/h"})
		errc <- err
	}()
	pool := oncetest.Pool(t, dbURL)
	oncetest.Eventually(t, 10*time.Second, "the hanging call charged", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE idempotency_key = 'daemon-hang' AND status = 'succeeded'`).Scan(&n)
		return n == 1
	})
	start := time.Now()
	require.NoError(t, d.Cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.Cmd.Wait(), d.Logs.String())
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, <-errc, gateway.ErrUnknownOutcome)
	require.Contains(t, d.Logs.String(), "mode=charge_then_hang")
}

func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}
