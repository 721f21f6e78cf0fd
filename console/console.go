// Package console is the operators' view of onceonly: an http.Handler that
// serves server-rendered pages answering the questions of someone on call —
// why did this request get a 409, what did we answer for key X and does
// Redis agree with Postgres, which executions are stuck or waiting to be
// resumed, is the relay behind — and the actions that follow from them:
// purge a key, repair its Redis value from Postgres, unpark outbox events.
//
// It embeds in any service the way River UI's handler does: build it with
// New, mount it under its Prefix, and Start its request sampler.
//
//	c, err := console.New(console.Config{Engine: engine, Pool: pool, Auth: "ops:" + secret})
//	if err != nil { … }
//	_ = c.Start(ctx) // the overview's chart of recent requests
//	defer c.Stop()
//	mux.Handle("/console/", c)
//
// The pages are HTML rendered on the server from embedded templates, with one
// embedded stylesheet and no script at all (the Content-Security-Policy
// allows none): they work in any browser, and a stored response holding
// markup shows as text. Every page is behind HTTP Basic authentication
// compared in constant time (or the host's own, Config.Authorize); every
// action is a POST form carrying a CSRF token. A GET never writes: its reads
// run in a read-only transaction, and Redis is only read (GET, PTTL, TIME). Stored
// bodies and requests sit behind a toggle (details/summary) and are never
// shown with Config.Redact.
//
// Reads go straight to the documented schema (the SQL is in sql/, one file
// per statement, run in exec mode so that Postgres plans each with its
// arguments); every write goes through the engine (Engine.Delete,
// Engine.RepairCache, Engine.Unpark), which keeps the invariants as its own
// transitions do.
package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/internal/defaults"
	"github.com/onceonly/onceonly/reconcile"
	"github.com/onceonly/onceonly/startstop"
)

// DefaultPrefix is the path the console is served under unless
// Config.Prefix says otherwise.
const DefaultPrefix = "/console"

// DefaultSampleInterval is how often the console samples the engine's
// request counters unless Config.SampleInterval says otherwise.
const DefaultSampleInterval = 5 * time.Second

// Config configures a Console. Engine, Pool and one of Auth or Authorize are
// required.
type Config struct {
	// Engine is the engine whose keys the console shows and acts on.
	Engine *onceonly.Engine
	// Pool is the engine's database (its Config.Pool): the pages read it.
	Pool *pgxpool.Pool
	// Prefix is the path the console is mounted under (DefaultPrefix when
	// empty); mount the console on Prefix + "/".
	Prefix string
	// Auth is "user:password": every request must carry them as HTTP Basic
	// credentials (CONSOLE_AUTH).
	Auth string
	// Authorize, instead of Auth, lets the host authenticate: it returns
	// the user a request acts as, or false to answer 401. Set CSRFKey with
	// it when several processes serve the console.
	Authorize func(r *http.Request) (user string, ok bool)
	// ReadOnly shows no form that changes anything and answers every POST
	// 403 (CONSOLE_READONLY).
	ReadOnly bool
	// Redact never shows a stored request, response body or step outcome
	// (CONSOLE_REDACT): they may hold personal data.
	Redact bool
	// CSRFKey signs the forms' CSRF tokens. By default it is derived from
	// Auth, so every process sharing the credentials accepts the others'
	// tokens; with Authorize and no key, a random key per process.
	CSRFKey []byte
	// SampleInterval is how often Start samples the engine's request
	// counters for the overview's chart (DefaultSampleInterval).
	SampleInterval time.Duration
	// Thresholds colour the overview's figures; each zero field takes its
	// default, DefaultThresholds's.
	Thresholds Thresholds
	// Logger receives the errors pages could not show (slog.Default when
	// nil).
	Logger *slog.Logger
}

// Thresholds say when the overview colours a figure as a warning or an
// alert. The defaults match the shipped alert rules
// (deploy/prometheus/alerts.yml) at the default settings: change them with
// the rules.
type Thresholds struct {
	// PendingWarn and PendingAlert are ages of the oldest event waiting in
	// the outbox: 5s, as OnceonlyRelayLagHigh, and 1m, as
	// OnceonlyRelayBehind (normal is about RELAY_POLL_INTERVAL).
	PendingWarn, PendingAlert time.Duration
	// StuckWarn and StuckAlert are how long the lease of an execution with
	// a step started has been over: 1s, REAP_GRACE, past which the
	// reconciler counts it stuck (onceonly_reconcile_stuck_executions),
	// and 10m, as OnceonlyStuckExecutions (stuck for 10 minutes).
	StuckWarn, StuckAlert time.Duration
}

// DefaultThresholds are the thresholds of the shipped alert rules.
var DefaultThresholds = Thresholds{
	PendingWarn: 5 * time.Second, PendingAlert: time.Minute,
	StuckWarn: reconcile.DefaultReapGrace, StuckAlert: 10 * time.Minute,
}

// level is the colour of a figure: "" (none), "warn" or "alert", the
// classes of console.css.
func level(d, warn, alert time.Duration) string {
	switch {
	case d > alert:
		return "alert"
	case d > warn:
		return "warn"
	}
	return ""
}

// Console serves the console's pages. It is an http.Handler; Start runs its
// request sampler.
type Console struct {
	cfg     Config
	prefix  string
	mux     *http.ServeMux
	guard   *guard
	pages   pages
	rates   *rates
	sampler startstop.Base
	log     *slog.Logger
	// keysByCodePoint caches whether the key column sorts by code point
	// (see sql/key_collation.sql); nil until first read.
	keysByCodePoint atomic.Pointer[bool]
}

// New returns a Console.
func New(cfg Config) (*Console, error) {
	if cfg.Engine == nil || cfg.Pool == nil {
		return nil, errors.New("console: Engine and Pool are required")
	}
	if (cfg.Auth == "") == (cfg.Authorize == nil) {
		return nil, errors.New("console: set one of Auth (user:password) and Authorize")
	}
	prefix := strings.TrimRight(cfg.Prefix, "/")
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("console: Prefix %q must start with /", cfg.Prefix)
	}
	defaults.Positive(&cfg.SampleInterval, DefaultSampleInterval)
	defaults.Positive(&cfg.Thresholds.PendingWarn, DefaultThresholds.PendingWarn)
	defaults.Positive(&cfg.Thresholds.PendingAlert, DefaultThresholds.PendingAlert)
	defaults.Positive(&cfg.Thresholds.StuckWarn, DefaultThresholds.StuckWarn)
	defaults.Positive(&cfg.Thresholds.StuckAlert, DefaultThresholds.StuckAlert)
	defaults.Logger(&cfg.Logger)
	g, err := newGuard(cfg.Auth, cfg.Authorize, cfg.CSRFKey)
	if err != nil {
		return nil, err
	}
	p, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{
		cfg: cfg, prefix: prefix, guard: g, pages: p, log: cfg.Logger,
		rates: newRates(cfg.Engine.RequestCounts, rateWindow),
	}
	c.mux = c.routes()
	return c, nil
}

// ParseAuth checks a CONSOLE_AUTH value: "user:password", neither empty.
func ParseAuth(auth string) error {
	user, password, ok := strings.Cut(auth, ":")
	if !ok || user == "" || password == "" {
		return errors.New("console: auth must be user:password, neither empty")
	}
	return nil
}

// Start samples the engine's request counters every SampleInterval until
// ctx ends or Stop is called, for the overview's chart of the last minutes.
// Without it the chart covers only the moments pages were viewed.
func (c *Console) Start(ctx context.Context) error {
	ctx, ok, started, stopped := c.sampler.StartInit(ctx)
	if !ok {
		return nil
	}
	go func() {
		defer stopped()
		started()
		t := time.NewTicker(c.cfg.SampleInterval)
		defer t.Stop()
		c.rates.sample(time.Now())
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				c.rates.sample(now)
			}
		}
	}()
	return nil
}

// Stop ends the sampler started by Start and waits for it.
func (c *Console) Stop() { c.sampler.Stop() }

// ServeHTTP serves a console request: every path under Prefix, once
// authenticated; POSTs only with a valid CSRF token, and none when
// ReadOnly.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script runs on any page; styles come from the console's own
	// stylesheet; nothing is framed, cached or sent on as a referrer (key
	// names are in the URLs).
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.URL.Path != c.prefix && !strings.HasPrefix(r.URL.Path, c.prefix+"/") {
		http.NotFound(w, r)
		return
	}
	user, ok := c.guard.authenticate(r)
	if !ok {
		h.Set("WWW-Authenticate", `Basic realm="onceonly console", charset="UTF-8"`)
		http.Error(w, "401 unauthorized: the console needs its credentials (CONSOLE_AUTH)", http.StatusUnauthorized)
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if c.cfg.ReadOnly {
			http.Error(w, "403 forbidden: the console is read-only (CONSOLE_READONLY)", http.StatusForbidden)
			return
		}
		if !c.guard.validToken(r.PostFormValue(csrfField), user, time.Now()) {
			http.Error(w, "403 forbidden: missing or stale form token; reload the page and try again", http.StatusForbidden)
			return
		}
	}
	c.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
}

// maxForm bounds the body of a form: ids, a token, a confirmation.
const maxForm = 64 << 10

// userKey is the context key of the authenticated user.
type userKey struct{}

// routes returns the console's routes, under its prefix.
func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	p := c.prefix
	mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, p+"/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET "+p+"/{$}", c.serveOverview)
	mux.HandleFunc("GET "+p+"/static/console.css", serveStylesheet)
	mux.HandleFunc("GET "+p+"/keys", c.serveKeys)
	mux.HandleFunc("GET "+p+"/keys/{scope}/{key}", c.serveKey)
	mux.HandleFunc("GET "+p+"/keys/{scope}/{key}/purge", c.servePurgeConfirm)
	mux.HandleFunc("POST "+p+"/keys/{scope}/{key}/purge", c.servePurge)
	mux.HandleFunc("POST "+p+"/keys/{scope}/{key}/repair", c.serveRepair)
	mux.HandleFunc("GET "+p+"/events", c.serveEvents)
	mux.HandleFunc("POST "+p+"/events/unpark", c.serveUnpark)
	return mux
}
