// Package paygateway is the payment gateway the demo's commands (the api,
// the consumer) charge through, and its settings: the gateway at
// GATEWAY_URL, or, when it is unset, a simulated one served in the process
// on the command's own Postgres.
package paygateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/demo/gateway"
)

// DefaultTimeout is GATEWAY_TIMEOUT's default.
const DefaultTimeout = 10 * time.Second

// Settings are the gateway settings of a command.
type Settings struct {
	URL                         *string
	Timeout, Latency, SlowDelay *time.Duration
}

// Define defines the gateway settings on s.
func Define(s *config.Set) *Settings {
	return &Settings{
		URL:       s.String("gateway-url", "GATEWAY_URL", "", "base URL of the payment gateway (unset: an in-process simulated gateway)"),
		Timeout:   s.Duration("gateway-timeout", "GATEWAY_TIMEOUT", DefaultTimeout, "the longest one gateway call may take"),
		Latency:   s.Duration("gateway-latency", "GATEWAY_LATENCY", 0, "in-process gateway: delay of every charge"),
		SlowDelay: s.Duration("slow-gateway-delay", "SLOW_GATEWAY_DELAY", gateway.DefaultSlowDelay, "in-process gateway: extra delay of source tok_slow"),
	}
}

// Validate checks the settings (parsed); the error is one line.
func (s *Settings) Validate() error {
	if *s.URL != "" {
		u, err := url.Parse(*s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("bad configuration: GATEWAY_URL=%q is not an http(s) URL", *s.URL)
		}
	}
	if *s.Timeout <= 0 {
		return errors.New("bad configuration: GATEWAY_TIMEOUT must be positive")
	}
	return nil
}

// InProcess reports whether the gateway is served in the process (on the
// command's Postgres), GATEWAY_URL being unset.
func (s *Settings) InProcess() bool { return *s.URL == "" }

// Open returns the client of the gateway at GATEWAY_URL, or of one served in
// this process on pool when it is unset, and a function that stops it
// (call it after ctx ended: it keeps ctx's values, not its end). lease is
// the engine's lease timeout: an in-process call's hold on its downstream
// key ends with this process within half of it, so a retry that takes the
// payment over after the lease finds the key free.
func (s *Settings) Open(ctx context.Context, pool *pgxpool.Pool, lease time.Duration, log *slog.Logger) (*gateway.Client, func(), error) {
	// The gateway joins the payment's trace (traceparent on every call).
	httpClient := &http.Client{Timeout: *s.Timeout, Transport: otelhttp.NewTransport(http.DefaultTransport)}
	if !s.InProcess() {
		return &gateway.Client{BaseURL: strings.TrimRight(*s.URL, "/"), HTTP: httpClient}, func() {}, nil
	}
	base, stop, err := gateway.StartInProcess(ctx, gateway.Config{
		Pool: pool, Latency: *s.Latency, SlowDelay: *s.SlowDelay, Logger: log,
		Lease: min(gateway.DefaultLease, lease/2),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start the in-process gateway: %w", err)
	}
	log.Warn("GATEWAY_URL is unset: charging through an in-process simulated gateway", "url", base)
	return &gateway.Client{BaseURL: base, HTTP: httpClient}, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = stop(sctx)
	}, nil
}
