// Package demotest is the demo's test kit: every test database package
// oncetest makes also carries the demo's payments table once this package is
// imported, and Gateway serves the demo's payment gateway.
package demotest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/demo/payments/schema"
	"github.com/onceonly/onceonly/oncetest"
)

func init() { //nolint:gochecknoinits // every test database of a package that imports demotest carries the demo's schema
	oncetest.AlsoMigrate(schema.FS(), schema.Migrations())
}

// Gateway serves the demo's payment gateway on pool (its schema migrated)
// for the test and returns a client of it with a 10 s call timeout.
func Gateway(tb testing.TB, pool *pgxpool.Pool, cfg gateway.Config) *gateway.Client {
	tb.Helper()
	if err := gateway.Migrate(context.Background(), pool); err != nil {
		tb.Fatalf("migrate the gateway: %v", err)
	}
	cfg.Pool = pool
	if cfg.Logger == nil {
		cfg.Logger = oncetest.QuietLogger()
	}
	h, err := gateway.NewHandler(cfg)
	if err != nil {
		tb.Fatalf("gateway: %v", err)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return &gateway.Client{BaseURL: srv.URL, HTTP: &http.Client{Timeout: 10 * time.Second}}
}
