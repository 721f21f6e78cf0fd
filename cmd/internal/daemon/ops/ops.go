// Package ops is what every command serves for its operators: /healthz,
// /readyz (its readiness checks) and /metrics (its Prometheus registry).
package ops

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// checkTimeout bounds the checks of one /readyz request.
const checkTimeout = 2 * time.Second

// Registry returns a Prometheus registry with the Go and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Check is one readiness check: nil when what it checks answers.
type Check func(ctx context.Context) error

// Handle serves /healthz (the process is up), /readyz and /metrics (reg)
// on mux. /readyz answers 503 "not_ready" when a required check fails, and
// 200 "degraded" when only optional ones do: the process still does its
// job, more slowly (the api without Redis answers from Postgres, so a load
// balancer must keep sending it traffic). Its body names every check with
// "ok" or its error.
func Handle(mux *http.ServeMux, reg *prometheus.Registry, required, optional map[string]Check) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), checkTimeout)
		defer cancel()
		status, code := "ready", http.StatusOK
		var parts []string
		run := func(checks map[string]Check, failed func()) {
			for name, check := range checks {
				if err := check(ctx); err != nil {
					failed()
					parts = append(parts, fmt.Sprintf("%q:%q", name, err.Error()))
				} else {
					parts = append(parts, fmt.Sprintf("%q:\"ok\"", name))
				}
			}
		}
		run(required, func() { status, code = "not_ready", http.StatusServiceUnavailable })
		run(optional, func() {
			if code == http.StatusOK {
				status = "degraded"
			}
		})
		slices.Sort(parts)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"status":%q,"checks":{%s}}`+"\n", status, strings.Join(parts, ","))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
}
