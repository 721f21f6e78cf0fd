// Command gateway serves the demo's simulated payment gateway: it charges at
// most once per Idempotency-Key and keeps its charges in Postgres, in schema
// gateway, which it migrates itself at start (see package gateway).
//
//	gateway          run until SIGTERM, serving /v1/charges, /healthz, /readyz, /metrics
//
// It needs no Redis.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/logger"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/demo/gateway"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// settings is the gateway's configuration. daemon.DefineCommon is not used:
// it defines the Redis settings, and the gateway has no Redis.
type settings struct {
	databaseURL, httpAddr, faults, logLevel, logFormat *string
	latency, slowDelay, hang                           *time.Duration
}

func define(s *config.Set) *settings {
	return &settings{
		databaseURL: s.String("database-url", "DATABASE_URL", "", "Postgres URL (required); the charges are kept in schema gateway"),
		httpAddr:    s.String("http-addr", "HTTP_ADDR", ":8083", "listen address of the gateway API (/v1/charges) and of /healthz, /readyz and /metrics"),
		latency:     s.Duration("gateway-latency", "GATEWAY_LATENCY", 0, "delay of every call before it is handled"),
		slowDelay:   s.Duration("slow-gateway-delay", "SLOW_GATEWAY_DELAY", gateway.DefaultSlowDelay, "how long a tok_slow charge takes"),
		faults: s.String("gateway-faults", "GATEWAY_FAULTS", "",
			"injected faults for chaos tests, mode=probability,... with modes charge_then_500, charge_then_hang, charge_then_reset and fail_before_charge (unset: none)"),
		hang:      s.Duration("gateway-hang", "GATEWAY_HANG", gateway.DefaultHang, "how long charge_then_hang holds its answer (less when the client goes away)"),
		logLevel:  s.String("log-level", "LOG_LEVEL", "info", "debug, info, warn or error"),
		logFormat: s.String("log-format", "LOG_FORMAT", "json", "json or text"),
	}
}

// setup is the configuration, validated.
type setup struct {
	postgres *pgxpool.Config
	gateway  gateway.Config
}

func run(args []string, _, stderr io.Writer) int {
	set := config.NewSet("gateway", stderr)
	set.SetSynopsis("usage: gateway [flags]      serve the simulated payment gateway (POST/GET /v1/charges)")
	s := define(set)
	if code, ok := daemon.ParseArgs(set, "gateway", args, stderr); !ok {
		return code
	}
	su, err := s.validate(set, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	ctx, stop := shutdown.SignalContext()
	defer stop()
	stopTracing, err := tracing.Start(ctx, "onceonly-gateway")
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	defer stopTracing()
	if err := serve(ctx, *s.httpAddr, su); err != nil {
		fmt.Fprintln(stderr, "gateway:", oneLine(err))
		return 1
	}
	return 0
}

// oneLine joins the lines of err's message (pgx lists every address it
// tried on a line of its own), so a failure is one line on stderr.
func oneLine(err error) string {
	var b strings.Builder
	for i, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if i > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

// validate checks the settings without connecting anywhere.
func (s *settings) validate(set *config.Set, stderr io.Writer) (setup, error) {
	if err := set.Require(map[string]*string{"database-url": s.databaseURL}); err != nil {
		return setup{}, err
	}
	log, err := logger.New(stderr, *s.logLevel, *s.logFormat)
	if err != nil {
		return setup{}, err
	}
	pg, err := postgres.Parse(*s.databaseURL)
	if err != nil {
		return setup{}, err
	}
	faults, err := gateway.ParseFaults(*s.faults)
	if err != nil {
		return setup{}, fmt.Errorf("bad configuration: GATEWAY_FAULTS=%q: %w", *s.faults, err)
	}
	if *s.slowDelay <= 0 {
		return setup{}, errors.New("bad configuration: SLOW_GATEWAY_DELAY must be positive")
	}
	if *s.hang <= 0 {
		return setup{}, errors.New("bad configuration: GATEWAY_HANG must be positive")
	}
	if strings.TrimSpace(*s.httpAddr) == "" {
		return setup{}, errors.New("bad configuration: HTTP_ADDR must not be empty")
	}
	return setup{postgres: pg, gateway: gateway.Config{
		Latency: *s.latency, SlowDelay: *s.slowDelay, Faults: faults, Hang: *s.hang, Logger: log,
	}}, nil
}

// serve connects Postgres, migrates the gateway's schema and serves until
// ctx ends.
func serve(ctx context.Context, addr string, su setup) error {
	log := su.gateway.Logger
	pool, err := pgxpool.NewWithConfig(ctx, su.postgres)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = pool.Ping(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	if err := gateway.Migrate(ctx, pool); err != nil {
		return err
	}

	reg := ops.Registry()
	cfg := su.gateway
	cfg.Pool, cfg.Registerer, cfg.Stopping = pool, reg, ctx.Done()
	api, err := gateway.NewHandler(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	ops.Handle(mux, reg, map[string]ops.Check{"postgres": pool.Ping}, nil)
	srv := &http.Server{
		Addr: addr, Handler: tracing.Handler(mux, "gateway"), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		// Calls end with ctx (SIGTERM): a hanging call is cut and a tok_slow
		// call that has not charged gives its key up (Config.Stopping), so
		// the shutdown is quick.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	log.Info("gateway started", "addr", addr, "latency", cfg.Latency.String(), "slow_delay", cfg.SlowDelay.String(),
		"faults", cfg.Faults.String(), "hang", cfg.Hang.String())
	return shutdown.Serve(ctx, srv, log, 5*time.Second)
}
