package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

// gw is one gateway handler served on a test server of its own.
type gw struct {
	URL    string
	Reg    *prometheus.Registry
	Client *gateway.Client
}

// migratedDB returns a pool on a fresh database of the test's own (the
// engine's schema included) with the gateway's schema migrated.
func migratedDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := oncetest.DB(t)
	require.NoError(t, gateway.Migrate(oncetest.Context(t), pool))
	return pool
}

// serve serves a handler with cfg over pool; the server is closed when the
// test ends.
func serve(t *testing.T, pool *pgxpool.Pool, cfg gateway.Config) *gw {
	t.Helper()
	cfg.Pool = pool
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	h, err := gateway.NewHandler(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &gw{URL: srv.URL, Reg: reg, Client: &gateway.Client{BaseURL: srv.URL, HTTP: &http.Client{Timeout: 30 * time.Second}}}
}

// testLogger logs into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// answer is one raw HTTP answer.
type answer struct {
	Code   int
	Header http.Header
	Body   string
}

// do sends a raw request; body "" sends none.
func do(t *testing.T, method, url string, header map[string]string, body string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(oncetest.Context(t), method, url, rd)
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return answer{Code: res.StatusCode, Header: res.Header, Body: string(b)}
}

// post sends a charge call with key and a JSON body.
func post(t *testing.T, base, key, body string) answer {
	t.Helper()
	return do(t, http.MethodPost, base+"/v1/charges", map[string]string{"Content-Type": "application/json", "Idempotency-Key": key}, body)
}

// chargeBody is a charge call's body.
func chargeBody(amount int64, source, reference string) string {
	return `{"amount":` + strconv.FormatInt(amount, 10) + `,"currency":"usd","source":"` + source + `","reference":"` + reference + `"}`
}

// row is a key's row in gateway.charges.
type row struct {
	Status, ChargeID string
	Found            bool
}

func readRow(t *testing.T, pool *pgxpool.Pool, key string) row {
	t.Helper()
	var r row
	err := pool.QueryRow(context.Background(),
		`SELECT status, coalesce(charge_id, '') FROM gateway.charges WHERE idempotency_key = $1`, key).Scan(&r.Status, &r.ChargeID)
	if err != nil {
		require.ErrorContains(t, err, "no rows")
		return row{}
	}
	r.Found = true
	return r
}

func countRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM gateway.charges`).Scan(&n))
	return n
}

// counter returns the value of the counter name{labels} in reg (0 when it
// has none).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
