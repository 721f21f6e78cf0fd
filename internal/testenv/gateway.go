package testenv

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/gateway"
)

// Gateway serves the demo's payment gateway on pool (its schema migrated)
// for the test and returns a client of it with a 10 s call timeout.
func Gateway(tb testing.TB, pool *pgxpool.Pool, cfg gateway.Config) *gateway.Client {
	tb.Helper()
	if err := gateway.Migrate(context.Background(), pool); err != nil {
		tb.Fatalf("migrate the gateway: %v", err)
	}
	cfg.Pool = pool
	if cfg.Logger == nil {
		cfg.Logger = QuietLogger()
	}
	h, err := gateway.NewHandler(cfg)
	if err != nil {
		tb.Fatalf("gateway: %v", err)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return &gateway.Client{BaseURL: srv.URL, HTTP: &http.Client{Timeout: 10 * time.Second}}
}
