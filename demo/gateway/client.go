package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ErrUnknownOutcome means the call's outcome is unknown: the gateway answered
// 5xx or 409, timed out, broke the connection, or sent a body that does not
// decode. The charge may or may not exist; a later call with the same
// Idempotency-Key, or a Lookup of the reference, tells.
var ErrUnknownOutcome = errors.New("gateway: outcome unknown")

// ErrUnavailable means the gateway answered 503: it is unavailable for now
// (its database, say). A charge call's error wraps ErrUnknownOutcome too.
var ErrUnavailable = errors.New("gateway: unavailable")

// ErrKeyReused means the Idempotency-Key was used before with other
// parameters (422): nothing was charged for this call.
var ErrKeyReused = errors.New("gateway: idempotency key reused with other parameters")

// InFlightError is the gateway's 409: another call with the same
// Idempotency-Key is in flight. It wraps ErrUnknownOutcome.
type InFlightError struct {
	// RetryAfter is how long the gateway asks to wait before calling again.
	RetryAfter time.Duration
}

// Error implements error.
func (e *InFlightError) Error() string {
	return fmt.Sprintf("a call with this idempotency key is in flight at the gateway (retry after %s): outcome unknown", e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrUnknownOutcome) hold.
func (e *InFlightError) Unwrap() error { return ErrUnknownOutcome }

// ChargeRequest is what a charge call asks for.
type ChargeRequest struct {
	// Amount in minor units, positive.
	Amount int64
	// Currency is a three-letter lowercase ISO 4217 code.
	Currency string
	// Source is tok_visa, tok_chargeDeclined, tok_slow or tok_gatewayError.
	Source string
	// Reference is "<merchant>/<idempotency key>", what Lookup finds the
	// charge by.
	Reference string
}

// Charge is a final charge: the body of the gateway's 201 or 402, and an
// item of a Lookup.
type Charge struct {
	// ID is the gateway's charge id, "ch_…".
	ID string `json:"id"`
	// Status is "succeeded" or "declined".
	Status string `json:"status"`
	// Amount is in minor units.
	Amount int64 `json:"amount"`
	// Currency is the lowercase ISO 4217 code.
	Currency string `json:"currency"`
	// Source is the charged source, e.g. tok_visa.
	Source string `json:"source"`
	// Reference is the reference the call carried.
	Reference string `json:"reference"`
	// Created is when the charge was made, RFC 3339.
	Created string `json:"created"`
}

// Client calls a gateway.
type Client struct {
	// BaseURL is the gateway's base URL, e.g. http://127.0.0.1:8083.
	BaseURL string
	// HTTP is the client calls go through (nil: http.DefaultClient). Bound
	// each call with its timeout or with the context.
	HTTP *http.Client
}

// maxAnswer bounds the answer bodies read.
const maxAnswer = 4 << 20

// Charge sends one charge call with idempotencyKey. 201 and 402 return the
// charge (Status "succeeded" or "declined") and nil. 5xx, a timeout, a broken
// connection, or a body that does not decode return an error wrapping
// ErrUnknownOutcome (the charge may or may not exist); 409 returns an
// *InFlightError, which wraps ErrUnknownOutcome too; 422 returns an error
// wrapping ErrKeyReused; any other 4xx is a plain error (a bug in the
// caller).
func (c *Client) Charge(ctx context.Context, idempotencyKey string, req ChargeRequest) (Charge, error) {
	payload, err := json.Marshal(map[string]any{
		"amount": req.Amount, "currency": req.Currency, "source": req.Source, "reference": req.Reference,
	})
	if err != nil {
		return Charge{}, fmt.Errorf("gateway: charge: encode request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/charges"), bytes.NewReader(payload))
	if err != nil {
		return Charge{}, fmt.Errorf("gateway: charge: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", idempotencyKey)
	res, err := c.client().Do(hreq)
	if err != nil {
		return Charge{}, fmt.Errorf("%w: charge %q: %w", ErrUnknownOutcome, idempotencyKey, err)
	}
	defer res.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	switch code := res.StatusCode; {
	case code == http.StatusCreated || code == http.StatusPaymentRequired:
		if readErr != nil {
			return Charge{}, fmt.Errorf("%w: charge %q: read the %d answer: %w", ErrUnknownOutcome, idempotencyKey, code, readErr)
		}
		var ch Charge
		if err := json.Unmarshal(body, &ch); err != nil {
			return Charge{}, fmt.Errorf("%w: charge %q: decode the %d answer: %w", ErrUnknownOutcome, idempotencyKey, code, err)
		}
		want := statusSucceeded
		if code == http.StatusPaymentRequired {
			want = statusDeclined
		}
		if ch.ID == "" || ch.Status != want {
			return Charge{}, fmt.Errorf("%w: charge %q: the %d answer holds id %q, status %q", ErrUnknownOutcome, idempotencyKey, code, ch.ID, ch.Status)
		}
		return ch, nil
	case code == http.StatusConflict:
		return Charge{}, fmt.Errorf("gateway: charge %q: %w", idempotencyKey, &InFlightError{RetryAfter: retryAfter(res.Header)})
	case code == http.StatusUnprocessableEntity:
		return Charge{}, fmt.Errorf("%w: charge %q: %s", ErrKeyReused, idempotencyKey, message(body))
	case code >= 400 && code < 500:
		return Charge{}, fmt.Errorf("gateway: charge %q refused with %d: %s", idempotencyKey, code, message(body))
	case code == http.StatusServiceUnavailable:
		return Charge{}, fmt.Errorf("%w: charge %q: %w: %s", ErrUnknownOutcome, idempotencyKey, ErrUnavailable, message(body))
	default:
		return Charge{}, fmt.Errorf("%w: charge %q answered %d: %s", ErrUnknownOutcome, idempotencyKey, code, message(body))
	}
}

// Charges is the answer of a look-up.
type Charges struct {
	// Data lists every final charge made for the reference, oldest first.
	Data []Charge `json:"data"`
	// InFlight counts the calls for the reference the gateway is still
	// working on: they may charge yet, so an empty Data does not prove that
	// nothing was charged while it is not zero.
	InFlight int `json:"in_flight"`
}

// Lookup lists the charges made for reference (see Charges).
func (c *Client) Lookup(ctx context.Context, reference string) (Charges, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/v1/charges?reference="+url.QueryEscape(reference)), nil)
	if err != nil {
		return Charges{}, fmt.Errorf("gateway: look up %q: %w", reference, err)
	}
	res, err := c.client().Do(hreq)
	if err != nil {
		return Charges{}, fmt.Errorf("gateway: look up %q: %w", reference, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	if err != nil {
		return Charges{}, fmt.Errorf("gateway: look up %q: read the answer: %w", reference, err)
	}
	if res.StatusCode == http.StatusServiceUnavailable {
		return Charges{}, fmt.Errorf("gateway: look up %q: %w: %s", reference, ErrUnavailable, message(body))
	}
	if res.StatusCode != http.StatusOK {
		return Charges{}, fmt.Errorf("gateway: look up %q answered %d: %s", reference, res.StatusCode, message(body))
	}
	var list struct {
		Data     *[]Charge `json:"data"`
		InFlight int       `json:"in_flight"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return Charges{}, fmt.Errorf("gateway: look up %q: decode the answer: %w", reference, err)
	}
	if list.Data == nil {
		return Charges{}, fmt.Errorf("gateway: look up %q: the answer has no data", reference)
	}
	return Charges{Data: *list.Data, InFlight: list.InFlight}, nil
}

func (c *Client) url(path string) string { return strings.TrimRight(c.BaseURL, "/") + path }

func (c *Client) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// retryAfter reads Retry-After in whole seconds; 1s when absent or unreadable.
func retryAfter(h http.Header) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After"))); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return time.Second
}

// message returns the error envelope's message, or the start of the body.
func message(body []byte) string {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Code + ": " + e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		return "(no body)"
	}
	return s
}
