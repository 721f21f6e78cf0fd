// Command api serves the demo payments API on onceonly, and runs the
// database migrations (api migrate up|down|status|version), the key
// inspection (api keys show|purge) and a health probe (api probe URL): see
// commands.go, or `api help`.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/paygateway"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/internal/config"
	"github.com/onceonly/onceonly/internal/redisconn"
	"github.com/onceonly/onceonly/payments"
	"github.com/onceonly/onceonly/payments/schema"
)

const demoAPIKeys = "sk_test_demo=acct_demo" //nolint:gosec // G101: the public demo key, accepted only while API_KEYS is unset, with a warning

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings is the api's configuration.
type settings struct {
	*daemon.Common
	engine      *daemon.Engine
	gateway     *paygateway.Settings
	apiKeys     *string
	deferNotify *bool
	force       *bool
}

func define(s *config.Set) *settings {
	return &settings{
		Common:      daemon.DefineCommon(s, ":8080", "Redis URL, redis:// or rediss://; unset with no cluster or Sentinel URL: Postgres only"),
		engine:      daemon.DefineEngine(s, "api"),
		gateway:     paygateway.Define(s),
		apiKeys:     s.String("api-keys", "API_KEYS", "", "API keys as key=merchant,... (unset: "+demoAPIKeys+", with a warning)"),
		deferNotify: s.Bool("defer-notify", "DEFER_NOTIFY", true, "keep the relay's NOTIFY out of the transactions (faster commits; the api notifies after a commit only when its write-through to Redis failed, and the relay polls for the rest); false notifies in every transaction"),
		force:       s.FlagSet().Bool("force", false, "keys purge: purge a key even while it is in progress"),
	}
}

// validated is the api's own configuration that needs more than a flag
// parse.
type validated struct {
	apiKeys  map[string]string
	demoKeys bool
}

func validate(s *settings) (validated, error) {
	var v validated
	raw := *s.apiKeys
	if raw == "" {
		raw, v.demoKeys = demoAPIKeys, true
	}
	keys, err := parseAPIKeys(raw)
	if err != nil {
		return v, err
	}
	v.apiKeys = keys
	if err := s.engine.Validate(); err != nil {
		return v, err
	}
	return v, s.gateway.Validate()
}

func parseAPIKeys(raw string) (map[string]string, error) {
	keys := map[string]string{}
	for pair := range strings.SplitSeq(raw, ",") {
		key, merchant, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || key == "" || merchant == "" || strings.Contains(merchant, ":") {
			return nil, fmt.Errorf("bad configuration: API_KEYS: %q is not key=merchant (merchant without ':')", pair)
		}
		keys[key] = merchant
	}
	return keys, nil
}

func serve(ctx context.Context, s *settings, v validated, setup daemon.Setup) error {
	log, pgCfg := setup.Log, setup.Postgres
	if v.demoKeys {
		log.Warn("API_KEYS is unset: accepting the demo key only", "api_key", "sk_test_demo", "merchant", "acct_demo")
	}
	rdb := redisconn.New(setup.Redis)
	if rdb != nil {
		defer rdb.Close()
	} else {
		log.Warn("REDIS_URL is unset: serving from Postgres alone")
	}
	pgCfg.MaxConns = max(pgCfg.MaxConns, 32)
	pool, err := postgres.Open(ctx, pgCfg, schema.Migrations())
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := ops.Registry()
	cfg := s.engine.Config()
	cfg.Pool, cfg.Redis, cfg.RedisPrefix, cfg.Logger, cfg.Registerer = pool, rdb, *s.RedisPrefix, log, reg
	cfg.Tuning = onceonly.Tuning{RedisWriteLayout1: *s.RedisWriteLayout1, NotifyInTransaction: !*s.deferNotify}
	engine, err := onceonly.New(cfg)
	if err != nil {
		return err
	}
	defer engine.Close()
	gw, stopGateway, err := s.gateway.Open(ctx, pool, *s.engine.LeaseTimeout, log)
	if err != nil {
		return err
	}
	defer stopGateway()
	// Without Redis the api still answers, from Postgres: Redis makes it
	// degraded, never unready.
	var optional map[string]ops.Check
	if rdb != nil {
		optional = map[string]ops.Check{"redis": redisconn.Check(rdb)}
	}
	mux := http.NewServeMux()
	ops.Handle(mux, reg, map[string]ops.Check{"postgres": pool.Ping}, optional)
	mux.Handle("/", payments.NewHandler(payments.Config{
		Engine: engine, Pool: pool, APIKeys: v.apiKeys, Gateway: gw, Logger: log,
		GatewayOnOwnDatabase: s.gateway.InProcess(),
	}))
	srv := &http.Server{
		Addr:              *s.HTTPAddr,
		Handler:           tracing.Handler(mux, "api"),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log.Info("api listening", "addr", *s.HTTPAddr, "redis", rdb != nil, "gateway", gw.BaseURL)
	resuming := make(chan struct{})
	go func() {
		defer close(resuming)
		_ = engine.Resume(ctx) // returns when ctx ends
	}()
	err = shutdown.Serve(ctx, srv, log, 9*time.Second)
	<-resuming
	return err
}
