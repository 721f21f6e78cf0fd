// Package gateway is the demo's simulated payment gateway: an HTTP service
// that charges at most once per Idempotency-Key, and a client for it.
//
// The server (NewHandler) answers
//
//	POST /v1/charges            Idempotency-Key: <key>   {"amount":…,"currency":…,"source":…,"reference":…}
//	GET  /v1/charges?reference=<merchant>/<key>
//
// The charge call answers 201 {"id":"ch_…","status":"succeeded",…} or 402
// {"id":"ch_…","status":"declined",…}, final: the same key always gets the
// same status and byte-identical body (replays carry Idempotent-Replayed:
// true) and is charged at most once. A call with a key another call holds
// gets 409 with Retry-After: 1; a key reused with another amount, currency,
// source or reference gets 422. The source picks the outcome: tok_visa
// succeeds, tok_chargeDeclined is declined, tok_slow succeeds after
// Config.SlowDelay, tok_gatewayError always gets 500 without a charge, and
// any other source is 400. Every call first waits Config.Latency. The look-up
// lists every final charge made for a reference, oldest first.
//
// Charges live in Postgres, in schema gateway (see Migrate), so several
// gateway processes on one database agree: a call owns its key by inserting
// a processing row (INSERT … ON CONFLICT DO NOTHING) that carries a short
// lease (Config.Lease), renews it every third of the lease while it works,
// and charges by turning the row final in one statement fenced by its lease
// token. A process that died mid-call (a gateway, or an api whose
// in-process gateway died with it) blocks the key no longer than that lease;
// the next call then takes it over. No transaction is open while a call
// waits. A call that owns its key finishes even when its client goes away,
// as a real gateway's does: it charges at its time and keeps the answer for
// the key,
// so the client's retry (or its successor's, if the client died) gets it
// replayed. Only a shutdown (Config.Stopping) cuts a tok_slow call short:
// it gives its key up uncharged at once.
//
// Faults can be injected for chaos tests (see Faults). Metrics:
// gateway_charges_total{status}, gateway_requests_total{code} and
// gateway_faults_total{mode}.
package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"mime"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/backoff"
)

// The sources a charge call accepts.
const (
	// SourceVisa is charged: 201, status succeeded.
	SourceVisa = "tok_visa"
	// SourceChargeDeclined is declined: 402, status declined.
	SourceChargeDeclined = "tok_chargeDeclined"
	// SourceSlow is charged like SourceVisa after Config.SlowDelay.
	SourceSlow = "tok_slow"
	// SourceGatewayError always gets 500 and is never charged.
	SourceGatewayError = "tok_gatewayError"
)

// Defaults of Config.
const (
	// DefaultSlowDelay is how long a tok_slow charge takes (SLOW_GATEWAY_DELAY).
	DefaultSlowDelay = 2 * time.Second
	// DefaultHang is how long charge_then_hang holds its answer (GATEWAY_HANG).
	DefaultHang = 30 * time.Second
	// DefaultLease is how long a call's hold on its key lasts without a
	// renewal: the longest a call whose process died blocks its key.
	DefaultLease = 2 * time.Second
	// MinLease is the shortest lease a call takes: a renewal, every third
	// of it, must have time to land on a busy machine.
	MinLease = 300 * time.Millisecond
)

const (
	// renewTimeout is the least time a renewal of a call's hold is given.
	renewTimeout = 250 * time.Millisecond
	// finishTimeout bounds the statements of a call that is charging, which
	// run without the client's context.
	finishTimeout = 10 * time.Second
	// maxBody is the largest charge request body accepted.
	maxBody = 64 << 10
	// maxReference is the longest reference accepted, in bytes.
	maxReference = 1024
	// maxKey is the longest Idempotency-Key accepted.
	maxKey = 255
)

// Config configures the gateway server.
type Config struct {
	// Pool is the Postgres pool the charges are kept in (schema gateway,
	// see Migrate). Required.
	Pool *pgxpool.Pool
	// Latency is waited at the start of every call (GATEWAY_LATENCY;
	// default 0).
	Latency time.Duration
	// SlowDelay is how long a tok_slow charge takes (SLOW_GATEWAY_DELAY;
	// zero means DefaultSlowDelay).
	SlowDelay time.Duration
	// Faults are the probabilities of injected faults (GATEWAY_FAULTS; the
	// zero value injects none).
	Faults Faults
	// Hang is how long charge_then_hang holds its answer (GATEWAY_HANG; zero
	// means DefaultHang). The hang also ends when the client goes away or
	// the request's context ends (the server shutting down).
	Hang time.Duration
	// Lease is how long a call holds its key without a renewal (zero means
	// DefaultLease); a live call renews it every third of it. It bounds how
	// long a call whose process died blocks its key, so it must be shorter
	// than the lease of any caller that retries through this gateway (the
	// api gives its in-process gateway half of LEASE_TIMEOUT at most). A
	// lease below MinLease is raised to it.
	Lease time.Duration
	// Stopping, once closed, cuts short the tok_slow calls that have not
	// charged yet, as a shutdown does: each gives its key up uncharged, so
	// the next call runs at once (nil: calls always finish).
	Stopping <-chan struct{}
	// Logger receives the gateway's logs (nil: slog.Default()).
	Logger *slog.Logger
	// Registerer receives the gateway's metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// handler serves the gateway API.
type handler struct {
	store                      store
	latency, slow, hang, lease time.Duration
	stopping                   <-chan struct{}
	faults                     Faults
	log                        *slog.Logger
	m                          *metrics
	mux                        *http.ServeMux
}

// NewHandler returns the gateway API: POST /v1/charges and GET /v1/charges.
// The schema must be current (Migrate). Handlers of several processes, or
// several handlers of one, may share a database.
func NewHandler(cfg Config) (http.Handler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("gateway: no Postgres pool")
	}
	if cfg.Latency < 0 || cfg.SlowDelay < 0 || cfg.Hang < 0 || cfg.Lease < 0 {
		return nil, errors.New("gateway: latency, slow delay, hang and lease must not be negative")
	}
	if err := cfg.Faults.validate(); err != nil {
		return nil, fmt.Errorf("gateway: faults: %w", err)
	}
	cfg.SlowDelay = cmp.Or(cfg.SlowDelay, DefaultSlowDelay)
	cfg.Hang = cmp.Or(cfg.Hang, DefaultHang)
	cfg.Lease = max(cmp.Or(cfg.Lease, DefaultLease), MinLease)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	h := &handler{
		store: store{pool: cfg.Pool}, latency: cfg.Latency, slow: cfg.SlowDelay, hang: cfg.Hang,
		lease: cfg.Lease, stopping: cfg.Stopping, faults: cfg.Faults, log: cfg.Logger, m: m,
		mux: http.NewServeMux(),
	}
	h.mux.HandleFunc("POST /v1/charges", h.postCharge)
	h.mux.HandleFunc("GET /v1/charges", h.listCharges)
	h.mux.HandleFunc("/v1/charges", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Allow", "GET, HEAD, POST")
		h.fail(w, http.StatusMethodNotAllowed, "method_not_allowed", "Use POST to charge or GET to look charges up.", "")
	})
	h.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		h.fail(w, http.StatusNotFound, "not_found", "No such endpoint.", "")
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// StartInProcess migrates the gateway's schema, then serves the gateway on a
// 127.0.0.1 listener inside the current process (the api uses it when
// GATEWAY_URL is unset). It returns the base URL (http://127.0.0.1:port) and
// stop, which ends the calls in flight (a hanging call is cut, a tok_slow
// call gives its key up) and shuts the server down within stop's context.
// ctx bounds the start only.
func StartInProcess(ctx context.Context, cfg Config) (baseURL string, stop func(context.Context) error, err error) {
	if err := Migrate(ctx, cfg.Pool); err != nil {
		return "", nil, err
	}
	// The server's calls carry ctx's values, not its end: stop ends them.
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cfg.Stopping = base.Done()
	h, err := NewHandler(cfg)
	if err != nil {
		cancel()
		return "", nil, err
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return "", nil, fmt.Errorf("gateway: listen: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("in-process gateway stopped", "err", err)
		}
	}()
	baseURL = "http://" + ln.Addr().String()
	log.Info("in-process gateway started", "url", baseURL, "faults", cfg.Faults.String())
	stop = func(ctx context.Context) error {
		cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return fmt.Errorf("gateway: shut down: %w", err)
		}
		return nil
	}
	return baseURL, stop, nil
}

// requestHash identifies a charge call's parameters (a key always goes with
// the same ones), to detect a key reused with others.
func requestHash(p ChargeRequest) string {
	canonical := strconv.FormatInt(p.Amount, 10) + "," + strconv.Quote(p.Currency) + "," +
		strconv.Quote(p.Source) + "," + strconv.Quote(p.Reference)
	sum := sha256.Sum256([]byte(canonical))
	return "v1:" + hex.EncodeToString(sum[:])
}

// problem is a refusal: an HTTP status and the error envelope's fields.
type problem struct {
	status               int
	code, message, param string
}

// Error codes answered more than once.
const (
	codeInvalidJSON        = "invalid_json"
	codeInvalidRequest     = "invalid_request"
	codeGatewayError       = "gateway_error"
	codeServiceUnavailable = "service_unavailable"
)

var currencyRE = regexp.MustCompile(`^[a-z]{3}$`)

// idempotencyKey returns the call's key, or why it is refused.
func idempotencyKey(r *http.Request) (string, *problem) {
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 || values[0] == "" {
		return "", &problem{http.StatusBadRequest, "idempotency_key_missing", "An Idempotency-Key header is required.", ""}
	}
	key := values[0]
	if len(values) > 1 || len(key) > maxKey || strings.IndexFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		return "", &problem{http.StatusBadRequest, "idempotency_key_invalid",
			"The Idempotency-Key must be one header of 1 to 255 printable ASCII characters without spaces.", ""}
	}
	return key, nil
}

// readCharge reads and checks the charge call's JSON body.
func readCharge(w http.ResponseWriter, r *http.Request) (ChargeRequest, *problem) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return ChargeRequest{}, &problem{http.StatusUnsupportedMediaType, "unsupported_media_type", "Send the body as application/json.", ""}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return ChargeRequest{}, &problem{http.StatusRequestEntityTooLarge, "request_too_large", "The body is larger than 64 KiB.", ""}
		}
		return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidJSON, "The body could not be read.", ""}
	}
	var in struct {
		Amount    *int64  `json:"amount"`
		Currency  *string `json:"currency"`
		Source    *string `json:"source"`
		Reference *string `json:"reference"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidRequest, te.Field + " has the wrong type.", te.Field}
		}
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field, _ = strconv.Unquote(field)
			return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidRequest, "Unknown parameter " + strconv.Quote(field) + ".", field}
		}
		return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidJSON, "The body is not a JSON object.", ""}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidJSON, "The body holds data after its JSON object.", ""}
	}
	bad := func(param, message string) (ChargeRequest, *problem) {
		return ChargeRequest{}, &problem{http.StatusBadRequest, codeInvalidRequest, message, param}
	}
	switch {
	case in.Amount == nil:
		return bad("amount", "amount is required.")
	case *in.Amount <= 0:
		return bad("amount", "amount must be a positive integer (minor units).")
	case in.Currency == nil:
		return bad("currency", "currency is required.")
	case !currencyRE.MatchString(*in.Currency):
		return bad("currency", "currency must be a three-letter lowercase ISO 4217 code.")
	case in.Source == nil:
		return bad("source", "source is required.")
	case in.Reference == nil || *in.Reference == "":
		return bad("reference", "reference is required.")
	case len(*in.Reference) > maxReference || !utf8.ValidString(*in.Reference) || strings.ContainsRune(*in.Reference, 0):
		return bad("reference", "reference must be valid UTF-8 text of at most 1024 bytes, without NUL.")
	}
	switch *in.Source {
	case SourceVisa, SourceChargeDeclined, SourceSlow, SourceGatewayError:
	default:
		return bad("source", "Unknown source; use tok_visa, tok_chargeDeclined, tok_slow or tok_gatewayError.")
	}
	return ChargeRequest{Amount: *in.Amount, Currency: *in.Currency, Source: *in.Source, Reference: *in.Reference}, nil
}

// outcome is how a charge call ended, short of faults.
type outcome struct {
	// status: 201 or 402 (final, with body), 409, 422, or 0 when the call
	// was cut short and gave its key up uncharged.
	status int
	body   []byte
	replay bool
}

func (h *handler) postCharge(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if backoff.Sleep(ctx, h.latency) != nil {
		h.cutShort(w)
		return
	}
	key, p := idempotencyKey(r)
	if p == nil {
		var req ChargeRequest
		if req, p = readCharge(w, r); p == nil {
			h.charge(w, r, key, req)
			return
		}
	}
	h.fail(w, p.status, p.code, p.message, p.param)
}

// charge runs a well-formed charge call.
func (h *handler) charge(w http.ResponseWriter, r *http.Request, key string, req ChargeRequest) {
	ctx := r.Context()
	if req.Source == SourceGatewayError {
		h.fail(w, http.StatusInternalServerError, codeGatewayError, "The payment gateway failed; nothing was charged.", "")
		return
	}
	mode := h.faults.pick(mathrand.Float64())
	if mode == FaultFailBeforeCharge {
		h.injected(mode, key)
		h.fail(w, http.StatusServiceUnavailable, codeServiceUnavailable, "The payment gateway is unavailable; retry with the same Idempotency-Key.", "")
		return
	}
	out, err := h.execute(ctx, key, req)
	if err != nil {
		level := slog.LevelWarn
		if ctx.Err() != nil {
			level = slog.LevelDebug
		}
		h.log.Log(ctx, level, "gateway charge failed", "key", key, "err", err)
		h.fail(w, http.StatusServiceUnavailable, codeServiceUnavailable, "The payment gateway could not reach its database; retry with the same Idempotency-Key.", "")
		return
	}
	switch out.status {
	case 0:
		h.cutShort(w)
		return
	case http.StatusConflict:
		h.fail(w, http.StatusConflict, "idempotency_key_in_use", "A call with this Idempotency-Key is in flight; retry later.", "")
		return
	case http.StatusUnprocessableEntity:
		h.fail(w, http.StatusUnprocessableEntity, "idempotency_key_reused", "This Idempotency-Key was used with other parameters.", "")
		return
	}
	switch mode {
	case FaultChargeThen500:
		h.injected(mode, key)
		h.fail(w, http.StatusInternalServerError, codeGatewayError, "The payment gateway failed; retry with the same Idempotency-Key.", "")
		return
	case FaultChargeThenHang:
		h.injected(mode, key)
		if backoff.Sleep(ctx, h.hang) != nil {
			// The client went away or the server is shutting down: cut the
			// connection, as a gateway that hung would.
			h.m.requests.WithLabelValues("none").Inc()
			panic(http.ErrAbortHandler)
		}
	case FaultChargeThenReset:
		h.injected(mode, key)
		h.reset(w)
		return
	}
	h.write(w, out.status, append(out.body, '\n'), out.replay)
}

// execute owns the key (or finds its answer) and charges.
func (h *handler) execute(ctx context.Context, key string, req ChargeRequest) (outcome, error) {
	hash := requestHash(req)
	// A few rounds: the row found may be released (or taken over) between
	// the statements.
	for range 5 {
		token := rand.Text()
		owned, err := h.store.claim(ctx, key, hash, req, token, h.lease)
		if err != nil {
			return outcome{}, err
		}
		if owned {
			return h.process(ctx, key, token, req)
		}
		row, found, err := h.store.read(ctx, key)
		if err != nil {
			return outcome{}, err
		}
		switch {
		case !found:
			continue
		case row.requestHash != hash:
			return outcome{status: http.StatusUnprocessableEntity}, nil
		case row.status != statusProcessing:
			return final(row), nil
		case row.live:
			return outcome{status: http.StatusConflict}, nil
		}
		took, err := h.store.takeOver(ctx, key, token, h.lease)
		if err != nil {
			return outcome{}, err
		}
		if took {
			h.log.Info("gateway took over a call whose lease ran out", "key", key)
			return h.process(ctx, key, token, req)
		}
	}
	return outcome{status: http.StatusConflict}, nil
}

// final is the stored answer of a final row.
func final(row existing) outcome {
	status := http.StatusCreated
	if row.status == statusDeclined {
		status = http.StatusPaymentRequired
	}
	return outcome{status: status, body: []byte(row.body), replay: true}
}

// errHoldLost is the cause that ends a call whose key was taken over.
var errHoldLost = errors.New("gateway: the call's hold on its key was taken over")

// process charges for a call that owns its key under token. The call goes
// on when its client goes away, as a real gateway's does; it renews its
// hold on the key while it works, so a process that dies mid-call blocks
// the key for one lease at most.
func (h *handler) process(ctx context.Context, key, token string, req ChargeRequest) (outcome, error) {
	ctx, stop := h.keepHold(context.WithoutCancel(ctx), key, token)
	defer stop()
	if req.Source == SourceSlow {
		timer := time.NewTimer(h.slow)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			// Another call holds the key now (this one stalled past its
			// lease): it is in flight there.
			return outcome{status: http.StatusConflict}, nil
		case <-h.stopping:
			// Cut short by a shutdown before the charge: give the key up,
			// so a retry runs now rather than after the lease.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
			defer cancel()
			if err := h.store.release(rctx, key, token); err != nil {
				h.log.Warn("gateway could not give a key up; it frees itself when its lease runs out", "key", key, "err", err)
			}
			return outcome{}, nil
		}
	}
	// The charge's statements run to their end: they are fenced by the
	// token, should the hold be lost meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	status, code := statusSucceeded, http.StatusCreated
	if req.Source == SourceChargeDeclined {
		status, code = statusDeclined, http.StatusPaymentRequired
	}
	now, err := h.store.now(ctx)
	if err != nil {
		return outcome{}, err
	}
	c := Charge{
		ID: "ch_" + rand.Text(), Status: status, Amount: req.Amount, Currency: req.Currency,
		Source: req.Source, Reference: req.Reference, Created: now.UTC().Format(time.RFC3339),
	}
	body, err := json.Marshal(c)
	if err != nil {
		return outcome{}, fmt.Errorf("encode charge: %w", err)
	}
	charged, err := h.store.charge(ctx, key, token, status, c.ID, now, body)
	if err != nil {
		return outcome{}, err
	}
	if !charged {
		// Another call took the key over (this one outlived its lease):
		// answer as it does.
		row, found, err := h.store.read(ctx, key)
		if err != nil {
			return outcome{}, err
		}
		if found && row.status != statusProcessing {
			return final(row), nil
		}
		return outcome{status: http.StatusConflict}, nil
	}
	h.m.charges.WithLabelValues(status).Inc()
	h.log.Debug("gateway charged", "key", key, "charge", c.ID, "status", status, "amount", c.Amount, "currency", c.Currency)
	return outcome{status: code, body: body}, nil
}

// keepHold renews the call's hold on key every third of the lease until
// stop is called. A renewal that finds the key no longer held under token
// (taken over after a stall) ends the returned context with errHoldLost;
// one that fails is tried again at the next tick (the charge is fenced by
// the token whatever happens).
func (h *handler) keepHold(ctx context.Context, key, token string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(h.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), max(h.lease/3, renewTimeout))
			held, err := h.store.renew(rctx, key, token, h.lease)
			rcancel()
			switch {
			case err != nil:
				h.log.Warn("gateway could not renew a call's hold on its key; it is tried again", "key", key, "err", err)
			case !held:
				cancel(errHoldLost)
				return
			}
		}
	}()
	return ctx, func() {
		close(quit)
		<-stopped
		cancel(nil)
	}
}

func (h *handler) listCharges(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if backoff.Sleep(ctx, h.latency) != nil {
		h.cutShort(w)
		return
	}
	ref := r.URL.Query().Get("reference")
	if ref == "" || len(ref) > maxReference || !utf8.ValidString(ref) || strings.ContainsRune(ref, 0) {
		h.fail(w, http.StatusBadRequest, codeInvalidRequest, "Give the reference to look up (?reference=<merchant>/<key>).", "reference")
		return
	}
	bodies, inFlight, err := h.store.lookup(ctx, ref)
	if err != nil {
		h.log.Warn("gateway look-up failed", "reference", ref, "err", err)
		h.fail(w, http.StatusServiceUnavailable, codeServiceUnavailable, "The payment gateway could not reach its database.", "")
		return
	}
	body := `{"data":[` + strings.Join(bodies, ",") + `],"in_flight":` + strconv.Itoa(inFlight) + "}\n"
	h.write(w, http.StatusOK, []byte(body), false)
}

// write sends an answer and counts it.
func (h *handler) write(w http.ResponseWriter, status int, body []byte, replay bool) {
	w.Header().Set("Content-Type", "application/json")
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	h.m.requests.WithLabelValues(strconv.Itoa(status)).Inc()
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// fail sends the error envelope {"error":{"type","code","message","param"}};
// 409 and 503 carry Retry-After: 1.
func (h *handler) fail(w http.ResponseWriter, status int, code, message, param string) {
	type apiError struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Param   string `json:"param,omitempty"`
	}
	typ := "invalid_request_error"
	switch {
	case status == http.StatusConflict || status == http.StatusUnprocessableEntity:
		typ = "idempotency_error"
	case status >= http.StatusInternalServerError:
		typ = "api_error"
	}
	body, err := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Type: typ, Code: code, Message: message, Param: param}})
	if err != nil { // strings always encode; never happens
		body = []byte(`{"error":{"type":"api_error","code":"internal_error"}}`)
	}
	if status == http.StatusConflict || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	h.write(w, status, append(body, '\n'), false)
}

// cutShort answers a call cut short before any charge (its client went away
// or the server is shutting down).
func (h *handler) cutShort(w http.ResponseWriter) {
	h.fail(w, http.StatusServiceUnavailable, codeServiceUnavailable, "The call was cut short before any charge; retry with the same Idempotency-Key.", "")
}

// injected counts and logs an injected fault.
func (h *handler) injected(mode, key string) {
	h.m.faults.WithLabelValues(mode).Inc()
	h.log.Info("gateway fault injected", "mode", mode, "key", key)
}

// reset drops the connection without an answer, with a TCP reset where it
// can.
func (h *handler) reset(w http.ResponseWriter) {
	h.m.requests.WithLabelValues("none").Inc()
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST, not FIN
	}
	_ = conn.Close()
}

// metrics are the gateway's Prometheus counters.
type metrics struct {
	charges, requests, faults *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		charges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_charges_total",
			Help: "Charges the gateway made (not replays), by status: succeeded or declined.",
		}, []string{"status"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_requests_total",
			Help: `Calls of the gateway API, by the HTTP status answered ("none": the connection was cut without an answer).`,
		}, []string{"code"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_faults_total",
			Help: "Faults injected (GATEWAY_FAULTS), by mode.",
		}, []string{"mode"}),
	}
	for _, s := range []string{statusSucceeded, statusDeclined} {
		m.charges.WithLabelValues(s)
	}
	for _, f := range faultModes {
		m.faults.WithLabelValues(f)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.charges, m.requests, m.faults} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}
