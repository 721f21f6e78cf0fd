// Package payments is the demo payments API: a small Stripe-like service
// whose POST /v1/payments runs through the onceonly middleware, so retries
// never charge twice. The charge happens at a payment gateway (package
// gateway, over HTTP) as a step with its own downstream idempotency key;
// the payment row commits with the key's completion after it.
package payments

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/gateway"
)

// Config configures the API.
type Config struct {
	Engine *onceonly.Engine
	Pool   *pgxpool.Pool
	// APIKeys maps a bearer API key to its merchant (the idempotency scope).
	APIKeys map[string]string
	// Gateway charges the payments (required).
	Gateway *gateway.Client
	// GatewayOnOwnDatabase says the gateway keeps its charges on this api's
	// Postgres (the in-process gateway): its 503 answers (its statements
	// failed, or it is shutting down with the api) are answered 503, as the
	// api's own Postgres failures are, rather than 502.
	GatewayOnOwnDatabase bool
	// GatewayAttempts is how many calls one request makes to the gateway
	// while its answer is unknown, before it looks the charge up (default
	// DefaultGatewayAttempts).
	GatewayAttempts int
	Logger          *slog.Logger
}

// HandlerName is the name the create handler is registered under, so a live
// api finishes a payment whose process died after the gateway was called.
const HandlerName = "payments.create"

// Payment is the API's payment object.
type Payment struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
	Status      string  `json:"status"`
	Charge      string  `json:"charge"`
	Created     string  `json:"created"`
}

type merchantKey struct{}

// NewHandler returns the API's routes.
func NewHandler(cfg Config) http.Handler {
	a := &api{cfg: cfg, payer: &Payer{Gateway: cfg.Gateway, GatewayAttempts: cfg.GatewayAttempts}}
	idem := cfg.Engine.Middleware(onceonly.MiddlewareOptions{
		Name:       HandlerName,
		Scope:      func(r *http.Request) (string, error) { return merchant(r.Context()), nil },
		MaxBody:    onceonly.DefaultMaxBody,
		WriteError: writeEngineError,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", a.authenticate(a.validateCreate(idem(http.HandlerFunc(a.create)))))
	mux.Handle("GET /v1/payments/{id}", a.authenticate(http.HandlerFunc(a.get)))
	mux.HandleFunc("/v1/payments", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/payments/{id}", methodNotAllowed("GET"))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "Unknown route.", "")
	})
	return mux
}

type api struct {
	cfg   Config
	payer *Payer
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here; use "+allow+".", "")
	}
}

func merchant(ctx context.Context) string {
	m, _ := ctx.Value(merchantKey{}).(string)
	return m
}

// authenticate maps the bearer API key to its merchant.
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		m, known := a.cfg.APIKeys[token]
		if !ok || !known {
			writeError(w, http.StatusUnauthorized, "unauthorized", "Missing or unknown API key; send Authorization: Bearer <api key>.", "")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey{}, m)))
	})
}

type createKey struct{}

// validateCreate turns bad input away before the idempotency layer, so it
// never claims a key: key header, media type, size, JSON, fields.
func (a *api) validateCreate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys, present := r.Header[http.CanonicalHeaderKey(onceonly.HeaderKey)]
		if !present {
			writeError(w, http.StatusBadRequest, "idempotency_key_missing", "The Idempotency-Key header is required.", onceonly.HeaderKey)
			return
		}
		if len(keys) != 1 || onceonly.ValidateKey(keys[0]) != nil {
			writeError(w, http.StatusBadRequest, "idempotency_key_invalid", "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces.", onceonly.HeaderKey)
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "Send the body as application/json.", "")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, onceonly.DefaultMaxBody))
		if err != nil {
			if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
				writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", "The request body is larger than 64 KiB.", "")
				return
			}
			writeError(w, http.StatusBadRequest, "invalid_request", "The request body could not be read.", "")
			return
		}
		req, err := parseCreate(body)
		if err != nil {
			if fe, ok := errors.AsType[*fieldError](err); ok {
				writeError(w, http.StatusBadRequest, "invalid_request", fe.message, fe.param)
				return
			}
			writeError(w, http.StatusBadRequest, "invalid_json", "The request body is not valid JSON.", "")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), createKey{}, req)))
	})
}

// create runs once per idempotency key, as an execution of the engine
// (Payer.Pay: the charge as a step, then the payment row, which commits
// with the key's completion), and answers what it did. On a resumption it
// runs on the stored request: the merchant comes from the execution.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	x, ok := onceonly.ExecutionOf(ctx)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal_error", "Not run by the idempotency engine.", "")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "The request body could not be read.", "")
		return
	}
	p, err := a.payer.Pay(ctx, x.Scope(), x.Key(), body)
	var unknown *ChargeUnknownError
	switch {
	case err == nil && p.Status == statusDeclined:
		a.writePayment(w, http.StatusPaymentRequired, p)
	case err == nil:
		a.writePayment(w, http.StatusCreated, p)
	case errors.Is(err, ErrInvalidBody):
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error(), "")
	case errors.As(err, &unknown):
		a.answerUnsettled(ctx, w, x.Scope(), x.Key(), unknown.Err)
	case errors.Is(err, ErrNotCharged):
		writeError(w, http.StatusBadGateway, "gateway_error", "The payment gateway failed; retry with the same Idempotency-Key.", "")
	default:
		a.cfg.Logger.Error("insert payment", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The payment could not be recorded; retry.", "")
	}
}

// answerUnsettled answers a payment whose charge has no known outcome. The
// key is handed off: the engine settles it (the same downstream key again,
// or the look-up) and a retry meanwhile gets 409. The answer names what
// failed, so the client knows how to wait: Postgres (503: the api's own
// statements, or those of the gateway on the api's database), the gateway
// still working on the charge (409), or the gateway (502).
func (a *api) answerUnsettled(ctx context.Context, w http.ResponseWriter, merchantID, key string, err error) {
	w.Header().Set("Retry-After", "1")
	switch {
	case errors.Is(err, onceonly.ErrLeaseLost) || errors.Is(context.Cause(ctx), onceonly.ErrLeaseLost):
		// The engine answers for an execution that lost its key.
		writeError(w, http.StatusConflict, "idempotency_key_in_use", "Another request holds this Idempotency-Key now; retry later.", "")
	case ctx.Err() != nil:
		// The client went away: nobody reads this answer.
		a.cfg.Logger.Info("charge outcome unknown: the client went away", "merchant", merchantID, "key", key)
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The request ended before the charge was known; retry with the same Idempotency-Key.", "")
	case errors.As(err, new(*gateway.InFlightError)):
		a.cfg.Logger.Info("charge in flight at the gateway", "merchant", merchantID, "key", key)
		writeError(w, http.StatusConflict, "idempotency_key_in_use", "The charge for this Idempotency-Key is in flight at the payment gateway; retry later.", "")
	case a.postgresFailed(ctx, err):
		a.cfg.Logger.Warn("charge outcome unknown: Postgres unavailable", "merchant", merchantID, "key", key, "err", err)
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The service is temporarily unavailable; retry with the same Idempotency-Key.", "")
	default:
		a.cfg.Logger.Warn("gateway outcome unknown", "merchant", merchantID, "key", key, "err", err)
		writeError(w, http.StatusBadGateway, "gateway_error", "The payment gateway did not answer; retry with the same Idempotency-Key.", "")
	}
}

// postgresFailed reports whether Postgres is what failed a charge step: the
// engine could not record it, the gateway on the api's own database (in
// process) could not reach it, or it does not answer the api now.
func (a *api) postgresFailed(ctx context.Context, err error) bool {
	if errors.Is(err, onceonly.ErrUnavailable) || (a.cfg.GatewayOnOwnDatabase && errors.Is(err, gateway.ErrUnavailable)) {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	return a.cfg.Pool.Ping(ctx) != nil
}

// writePayment answers a recorded payment: 201 with its Location, or 402
// with the declined payment in the error.
func (a *api) writePayment(w http.ResponseWriter, status int, p Payment) {
	if status == http.StatusPaymentRequired {
		writeJSON(w, status, map[string]any{"error": map[string]any{
			"type": "card_error", "code": "card_declined", "message": "Your card was declined.", "payment": p,
		}})
		return
	}
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, status, p)
}

// paymentColumns are a payment's columns as scanPayment reads them. The
// creation time is formatted here, not by to_char in the statement: Citus
// refuses a function that is not immutable in an INSERT's RETURNING.
const paymentColumns = `id, amount, currency, customer, description, status, coalesce(charge_id, ''), created_at`

func scanPayment(row pgx.Row) (Payment, error) {
	p := Payment{Object: "payment"}
	var created time.Time
	if err := row.Scan(&p.ID, &p.Amount, &p.Currency, &p.Customer, &p.Description, &p.Status, &p.Charge, &created); err != nil {
		return p, fmt.Errorf("read payment: %w", err)
	}
	p.Created = created.UTC().Format("2006-01-02T15:04:05Z")
	return p, nil
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	p, err := scanPayment(a.cfg.Pool.QueryRow(r.Context(),
		`SELECT `+paymentColumns+` FROM payments WHERE id = $1 AND merchant_id = $2`, r.PathValue("id"), merchant(r.Context())))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeError(w, http.StatusNotFound, "not_found", "No such payment.", "id")
	case err != nil:
		a.cfg.Logger.Warn("get payment", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The service is temporarily unavailable; retry later.", "")
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func newPaymentID() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return "pay_" + string(b)
}
