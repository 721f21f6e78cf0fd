// Command api serves the demo payments API on onceonly, and runs the
// database migrations (api migrate up|down|status|version), the key
// inspection (api keys show|purge) and a health probe (api probe URL): see
// commands.go, or `api help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/paygateway"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/console"
	"github.com/onceonly/onceonly/demo/payments"
	"github.com/onceonly/onceonly/demo/payments/schema"
)

const demoAPIKeys = "sk_test_demo=acct_demo" //nolint:gosec // G101: the public demo key, accepted only while API_KEYS is unset, with a warning

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings is the api's configuration.
type settings struct {
	*daemon.Common
	engine          *daemon.Engine
	gateway         *paygateway.Settings
	apiKeys         *string
	deferNotify     *bool
	force           *bool
	consoleAuth     *string
	consoleAddr     *string
	consoleReadOnly *bool
	consoleRedact   *bool
}

func define(s *config.Set) *settings {
	return &settings{
		Common:          daemon.DefineCommon(s, ":8080", "Redis URL, redis:// or rediss://; unset with no cluster or Sentinel URL: Postgres only"),
		engine:          daemon.DefineEngine(s, "api"),
		gateway:         paygateway.Define(s),
		apiKeys:         s.String("api-keys", "API_KEYS", "", "API keys as key=merchant,... (unset: "+demoAPIKeys+", with a warning)"),
		deferNotify:     s.Bool("defer-notify", "DEFER_NOTIFY", true, "keep the relay's NOTIFY out of the transactions (faster commits; the api notifies after a commit only when its write-through to Redis failed, and the relay polls for the rest); false notifies in every transaction"),
		force:           s.FlagSet().Bool("force", false, "keys purge: purge a key even while it is in progress"),
		consoleAuth:     s.String("console-auth", "CONSOLE_AUTH", "", "user:password of the operators' console served under /console/ (HTTP Basic); unset: no console, every /console/ path answers 404"),
		consoleAddr:     s.String("console-addr", "CONSOLE_ADDR", "", "address the console listens on apart from the API, e.g. 127.0.0.1:8081 (loopback: reach it through an SSH tunnel or a TLS-terminating proxy); unset: under /console/ on HTTP_ADDR"),
		consoleReadOnly: s.Bool("console-readonly", "CONSOLE_READONLY", false, "the console shows no form that changes anything and answers every POST 403"),
		consoleRedact:   s.Bool("console-redact", "CONSOLE_REDACT", false, "the console never shows stored request or response bodies"),
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
	if *s.consoleAuth != "" {
		if err := console.ParseAuth(*s.consoleAuth); err != nil {
			return v, errors.New("bad configuration: CONSOLE_AUTH must be user:password, neither empty")
		}
	}
	if *s.consoleAddr != "" && *s.consoleAuth == "" {
		return v, errors.New("bad configuration: CONSOLE_ADDR needs CONSOLE_AUTH (no console is served without it)")
	}
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
	log := setup.Log
	if v.demoKeys {
		log.Warn("API_KEYS is unset: accepting the demo key only", "api_key", "sk_test_demo", "merchant", "acct_demo")
	}
	if setup.Redis == nil {
		log.Warn("REDIS_URL is unset: serving from Postgres alone")
	}
	rt, err := daemon.OpenRuntime(ctx, setup, s.Common, s.engine, daemon.RuntimeOptions{
		MinConns: 32, Schema: schema.Migrations(),
		Configure: func(cfg *onceonly.Config) { cfg.Tuning.NotifyInTransaction = !*s.deferNotify },
	})
	if err != nil {
		return err
	}
	defer rt.Close()
	pool, rdb, reg, engine := rt.Pool, rt.Redis, rt.Registry, rt.Engine
	gw, stopGateway, err := s.gateway.Open(ctx, pool, *s.engine.LeaseTimeout, log)
	if err != nil {
		return err
	}
	defer stopGateway()
	// Without Redis the api still answers, from Postgres: Redis makes it
	// degraded, never unready.
	var optional map[string]ops.Check
	if rdb != nil {
		optional = map[string]ops.Check{"redis": cache.ReadyCheck(rdb)}
	}
	mux := http.NewServeMux()
	ops.Handle(mux, reg, map[string]ops.Check{"postgres": pool.Ping}, optional)
	// With CONSOLE_ADDR the console has a listener of its own, and the
	// API's /console/ paths answer 404 as without a console.
	consoleMux := mux
	if *s.consoleAddr != "" {
		consoleMux = http.NewServeMux()
		mountNoConsole(mux)
	}
	stopConsole, err := mountConsole(ctx, consoleMux, s, engine, pool, log)
	if err != nil {
		return err
	}
	defer stopConsole()
	mux.Handle("/", payments.NewHandler(payments.Config{
		Engine: engine, Pool: pool, APIKeys: v.apiKeys, Gateway: gw, Logger: log,
		GatewayOnOwnDatabase: s.gateway.InProcess(),
	}))
	// The api's answers by status code, for the 5xx alert
	// (deploy/prometheus/alerts.yml): the engine's outcomes do not say what
	// the demo answered.
	answered := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_http_requests_total",
		Help: "HTTP requests the api answered, by status code and method.",
	}, []string{"code", "method"})
	if err := reg.Register(answered); err != nil {
		return fmt.Errorf("register the api's metrics: %w", err)
	}
	srv := &http.Server{
		Addr:              *s.HTTPAddr,
		Handler:           tracing.Handler(promhttp.InstrumentHandlerCounter(answered, mux), "api"),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log.Info("api listening", "addr", *s.HTTPAddr, "redis", rdb != nil, "gateway", gw.BaseURL)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consoleDone := make(chan error, 1)
	if *s.consoleAddr != "" {
		csrv := &http.Server{
			Addr: *s.consoleAddr, Handler: consoleMux,
			ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		}
		log.Info("console listening", "addr", *s.consoleAddr)
		go func() {
			err := shutdown.Serve(ctx, csrv, log, 9*time.Second)
			cancel() // a console that cannot listen stops the api, as the api's own address does
			consoleDone <- err
		}()
	} else {
		consoleDone <- nil
	}
	resuming := make(chan struct{})
	go func() {
		defer close(resuming)
		_ = engine.Resume(ctx) // returns when ctx ends
	}()
	err = shutdown.Serve(ctx, srv, log, 9*time.Second)
	cancel()
	<-resuming
	return errors.Join(err, <-consoleDone)
}

// mountNoConsole answers 404 on every /console/ path of mux.
func mountNoConsole(mux *http.ServeMux) {
	mux.Handle(console.DefaultPrefix+"/", http.NotFoundHandler())
	mux.Handle(console.DefaultPrefix, http.NotFoundHandler())
}

// mountConsole serves the operators' console under /console/ of mux (the
// API's, or the console's own with CONSOLE_ADDR) when CONSOLE_AUTH is set;
// otherwise every /console/ path answers 404, with or
// without credentials. The returned function stops the console's sampler.
func mountConsole(ctx context.Context, mux *http.ServeMux, s *settings, engine *onceonly.Engine, pool *pgxpool.Pool, log *slog.Logger) (func(), error) {
	if *s.consoleAuth == "" {
		mountNoConsole(mux)
		return func() {}, nil
	}
	c, err := console.New(console.Config{
		Engine: engine, Pool: pool, Auth: *s.consoleAuth,
		ReadOnly: *s.consoleReadOnly, Redact: *s.consoleRedact, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("start the console: %w", err)
	}
	mux.Handle(console.DefaultPrefix+"/", c)
	mux.Handle(console.DefaultPrefix, c)
	log.Info("console served", "path", console.DefaultPrefix+"/", "read_only", *s.consoleReadOnly, "redact", *s.consoleRedact)
	return c.Stop, nil
}
