package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
)

func ok(context.Context) error { return nil }

func down(context.Context) error { return errors.New("connection refused") }

// get serves one request to a mux set up by ops.Handle.
func get(t *testing.T, required, optional map[string]ops.Check, path string) (code int, contentType, body string) {
	t.Helper()
	reg := ops.Registry()
	counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "ops_test_total", Help: "a test counter"})
	reg.MustRegister(counter)
	counter.Add(3)
	mux := http.NewServeMux()
	ops.Handle(mux, reg, required, optional)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Code, rec.Header().Get("Content-Type"), string(b)
}

func TestHealthz(t *testing.T) {
	code, ct, body := get(t, map[string]ops.Check{"postgres": down}, nil, "/healthz")
	require.Equal(t, http.StatusOK, code, "up, whatever the checks say")
	require.Equal(t, "application/json", ct)
	require.JSONEq(t, `{"status":"ok"}`, body)
}

func TestReadyz(t *testing.T) {
	for _, tc := range []struct {
		name               string
		required, optional map[string]ops.Check
		code               int
		want               string
	}{
		{"all ok", map[string]ops.Check{"postgres": ok}, map[string]ops.Check{"redis": ok},
			http.StatusOK, `{"status":"ready","checks":{"postgres":"ok","redis":"ok"}}`},
		{"no checks", nil, nil, http.StatusOK, `{"status":"ready","checks":{}}`},
		{"optional down", map[string]ops.Check{"postgres": ok}, map[string]ops.Check{"redis": down},
			http.StatusOK, `{"status":"degraded","checks":{"postgres":"ok","redis":"connection refused"}}`},
		{"required down", map[string]ops.Check{"postgres": down, "redis": ok}, nil,
			http.StatusServiceUnavailable, `{"status":"not_ready","checks":{"postgres":"connection refused","redis":"ok"}}`},
		{"both down", map[string]ops.Check{"postgres": down}, map[string]ops.Check{"redis": down},
			http.StatusServiceUnavailable, `{"status":"not_ready","checks":{"postgres":"connection refused","redis":"connection refused"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, ct, body := get(t, tc.required, tc.optional, "/readyz")
			require.Equal(t, tc.code, code, body)
			require.Equal(t, "application/json", ct)
			require.JSONEq(t, tc.want, body)
			require.True(t, json.Valid([]byte(body)))
		})
	}
}

func TestMetrics(t *testing.T) {
	code, _, body := get(t, nil, nil, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "ops_test_total 3")
	require.Contains(t, body, "go_goroutines ")
	require.Contains(t, body, "process_start_time_seconds ")
}

func TestMethods(t *testing.T) {
	code, _, _ := get(t, nil, nil, "/nothing")
	require.Equal(t, http.StatusNotFound, code)
	reg := ops.Registry()
	mux := http.NewServeMux()
	ops.Handle(mux, reg, nil, nil)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/healthz", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}
