// Package payments is the demo payments API: a small Stripe-like service
// whose POST /v1/payments runs through the onceonly middleware, so retries
// never charge twice. A simulated gateway chooses the outcome by source.
package payments

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
)

// Config configures the API.
type Config struct {
	Engine *onceonly.Engine
	Pool   *pgxpool.Pool
	// APIKeys maps a bearer API key to its merchant (the idempotency scope).
	APIKeys map[string]string
	// GatewayLatency is added to every charge (simulated gateway).
	GatewayLatency time.Duration
	// SlowGatewayDelay is the delay of tok_slow.
	SlowGatewayDelay time.Duration
	Logger           *slog.Logger
}

// Payment is the API's payment object.
type Payment struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
	Status      string  `json:"status"`
	Created     string  `json:"created"`
}

type merchantKey struct{}

// NewHandler returns the API's routes.
func NewHandler(cfg Config) http.Handler {
	a := &api{cfg: cfg}
	idem := cfg.Engine.Middleware(onceonly.MiddlewareOptions{
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
	cfg Config
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
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", "The request body is larger than 64 KiB.", "")
				return
			}
			writeError(w, http.StatusBadRequest, "invalid_request", "The request body could not be read.", "")
			return
		}
		req, err := parseCreate(body)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
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

// create runs once per idempotency key, inside the engine's transaction.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	req, _ := ctx.Value(createKey{}).(CreateRequest)
	tx, ok := onceonly.Tx(ctx)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal_error", "No idempotency transaction.", "")
		return
	}
	delay := a.cfg.GatewayLatency
	if req.Source == SourceSlow {
		delay += a.cfg.SlowGatewayDelay
	}
	if !sleep(ctx, delay) {
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The request was canceled.", "")
		return
	}
	status, httpStatus := "succeeded", http.StatusCreated
	switch req.Source {
	case SourceGatewayError:
		writeError(w, http.StatusBadGateway, "gateway_error", "The payment gateway failed; retry with the same Idempotency-Key.", "")
		return
	case SourceDeclined:
		status, httpStatus = "declined", http.StatusPaymentRequired
	}
	p, err := insertPayment(ctx, tx, merchant(ctx), r.Header.Get(onceonly.HeaderKey), req, status)
	if err != nil {
		a.cfg.Logger.Error("insert payment", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "The payment could not be recorded; retry.", "")
		return
	}
	if httpStatus == http.StatusPaymentRequired {
		writeJSON(w, httpStatus, map[string]any{"error": map[string]any{
			"type": "card_error", "code": "card_declined", "message": "Your card was declined.", "payment": p,
		}})
		return
	}
	writeJSON(w, httpStatus, p)
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

const paymentColumns = `id, amount, currency, customer, description, status,
	to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')`

func insertPayment(ctx context.Context, tx pgx.Tx, merchantID, key string, req CreateRequest, status string) (Payment, error) {
	return scanPayment(tx.QueryRow(ctx, `INSERT INTO payments
		(id, merchant_id, idempotency_key, amount, currency, customer, description, status)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING `+paymentColumns,
		newPaymentID(), merchantID, key, req.Amount, req.Currency, req.Customer, req.Description, status))
}

func scanPayment(row pgx.Row) (Payment, error) {
	p := Payment{Object: "payment"}
	err := row.Scan(&p.ID, &p.Amount, &p.Currency, &p.Customer, &p.Description, &p.Status, &p.Created)
	return p, err
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
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
