package payments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/backoff"
	"github.com/onceonly/onceonly/demo/gateway"
)

// DefaultGatewayAttempts is Payer.GatewayAttempts when unset.
const DefaultGatewayAttempts = 3

// Payer runs payment commands: the one code path behind POST /v1/payments
// and the demo consumer's messages, so both validate, charge and record a
// payment alike.
type Payer struct {
	// Gateway charges the payments (required).
	Gateway *gateway.Client
	// GatewayAttempts is how many calls one execution makes to the gateway
	// while its answer is unknown, before it looks the charge up (default
	// DefaultGatewayAttempts).
	GatewayAttempts int
}

// ErrNotCharged is returned by Pay when the gateway is known to have
// charged nothing (tok_gatewayError, or a look-up that lists no charge
// after the gateway answered). It wraps onceonly.ErrNoEffect: returned by
// a handler, it fails the key (counted) rather than handing it off, and a
// retry runs again.
var ErrNotCharged = fmt.Errorf("payments: the payment gateway failed without charging: %w", onceonly.ErrNoEffect)

// ErrNotRecorded wraps the error of a payment the gateway charged but whose
// row could not be written: the execution fails, and its retry finds the
// charge recorded by the step and writes the row.
var ErrNotRecorded = errors.New("payments: the payment could not be recorded")

// ChargeUnknownError is returned by Pay when the charge's outcome is not
// known: the gateway did not answer, or is still working on the call. The
// step stays unsettled, so the engine keeps the key for a resumption (or
// the next attempt) that calls again with the same downstream key (I12).
type ChargeUnknownError struct {
	// Err is the step's error.
	Err error
}

// Error returns the step's error's message.
// The statuses of a payment row.
const (
	statusSucceeded = "succeeded"
	statusDeclined  = "declined"
)

func (e *ChargeUnknownError) Error() string { return "charge outcome unknown: " + e.Err.Error() }

// Unwrap returns the step's error.
func (e *ChargeUnknownError) Unwrap() error { return e.Err }

// Pay runs one payment command as the execution in ctx (run by the
// engine: the api's middleware, or Engine.Run for a message): merchant
// and key are the execution's scope and key, body a create body as
// POST /v1/payments takes it. It charges at the gateway as the step
// "charge", with the downstream key the engine derives from merchant, key
// and step alone (I11), then writes the payment row through the
// execution's transaction, which commits with the key's completion. The
// payment's Status says whether the card was declined.
//
// Errors: a body that does not validate (ErrInvalidBody), ErrNotCharged,
// *ChargeUnknownError, ErrNotRecorded, and the engine's own
// (onceonly.ErrNoExecution outside an execution).
func (p *Payer) Pay(ctx context.Context, merchant, key string, body []byte) (Payment, error) {
	req, err := parseCreate(body)
	if err != nil {
		return Payment{}, fmt.Errorf("%w: %w", ErrInvalidBody, err)
	}
	charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, downstreamKey string) (gateway.Charge, error) {
		return p.charge(ctx, downstreamKey, gateway.ChargeRequest{
			Amount: req.Amount, Currency: req.Currency, Source: req.Source, Reference: merchant + "/" + key,
		})
	})
	if err != nil {
		return Payment{}, &ChargeUnknownError{Err: err}
	}
	if charge.ID == "" {
		return Payment{}, ErrNotCharged
	}
	status := statusSucceeded
	if charge.Status == statusDeclined {
		status = statusDeclined
	}
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return Payment{}, fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	payment, err := insertPayment(ctx, tx, merchant, key, req, status, charge.ID)
	if err != nil {
		return Payment{}, fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	return payment, nil
}

// charge calls the gateway with the step's downstream key until it
// answers, at most GatewayAttempts times, then looks the charge up. It
// returns the charge, a Charge without ID when the gateway is known to
// have charged nothing, or an error when the outcome stays unknown.
func (p *Payer) charge(ctx context.Context, key string, req gateway.ChargeRequest) (gateway.Charge, error) {
	attempts := p.GatewayAttempts
	if attempts <= 0 {
		attempts = DefaultGatewayAttempts
	}
	var lastErr error
	var answered bool // the last failure was an answer of the gateway, not a lost call
	for attempt := 1; ; attempt++ {
		c, err := p.Gateway.Charge(ctx, key, req)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, gateway.ErrUnknownOutcome) {
			return gateway.Charge{}, err // a request the gateway refuses: a bug here
		}
		lastErr = err
		var inFlight *gateway.InFlightError
		isInFlight := errors.As(err, &inFlight)
		answered = !isInFlight && !lostCall(err)
		if attempt >= attempts || ctx.Err() != nil {
			break
		}
		wait := time.Duration(attempt) * 100 * time.Millisecond
		if isInFlight {
			wait = min(max(inFlight.RetryAfter, wait), time.Second)
		}
		if backoff.Sleep(ctx, wait) != nil {
			break
		}
	}
	charges, err := p.Gateway.Lookup(ctx, req.Reference)
	switch {
	case err != nil:
		return gateway.Charge{}, fmt.Errorf("outcome unknown (%w); look-up failed: %w", lastErr, err)
	case len(charges.Data) > 0:
		return charges.Data[0], nil
	case answered && charges.InFlight == 0:
		return gateway.Charge{}, nil
	case charges.InFlight > 0:
		// The gateway is still working on the call: it is in flight there.
		return gateway.Charge{}, fmt.Errorf("outcome unknown (%w): %w", lastErr, &gateway.InFlightError{RetryAfter: time.Second})
	}
	return gateway.Charge{}, fmt.Errorf("outcome unknown: %w", lastErr)
}

// lostCall reports whether a gateway call failed without an answer: a
// timeout, a broken connection, an answer cut short. Such a call may have
// charged even when the look-up finds nothing yet (the gateway may still be
// working on it).
func lostCall(err error) bool {
	var ue *url.Error
	return errors.As(err, &ue) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
}

func insertPayment(ctx context.Context, tx pgx.Tx, merchantID, key string, req CreateRequest, status, chargeID string) (Payment, error) {
	return scanPayment(tx.QueryRow(ctx, `INSERT INTO payments
		(id, merchant_id, idempotency_key, amount, currency, customer, description, status, charge_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+paymentColumns,
		newPaymentID(), merchantID, key, req.Amount, req.Currency, req.Customer, req.Description, status, chargeID))
}
