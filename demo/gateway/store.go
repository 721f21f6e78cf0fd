package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row statuses of gateway.charges.
const (
	statusProcessing = "processing"
	statusSucceeded  = "succeeded"
	statusDeclined   = "declined"
)

// store holds the gateway's statements. Each runs alone (autocommit): no
// transaction is ever open while a call waits.
type store struct{ pool *pgxpool.Pool }

// existing is what a call that did not insert its key finds in the row.
type existing struct {
	requestHash, status, body string
	// live: a processing row whose lease has not run out.
	live bool
}

// claim owns key for the call by inserting its processing row; false when
// the key already has a row.
func (s store) claim(ctx context.Context, key, hash string, req ChargeRequest, token string, lease time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
INSERT INTO gateway.charges
    (idempotency_key, request_hash, amount, currency, source, reference, status, lease_token, lease_until)
VALUES ($1, $2, $3, $4, $5, $6, 'processing', $7, now() + $8 * interval '1 millisecond')
ON CONFLICT (idempotency_key) DO NOTHING`,
		key, hash, req.Amount, req.Currency, req.Source, req.Reference, token, lease.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("claim key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// read returns the key's row; found is false when there is none (released
// since).
func (s store) read(ctx context.Context, key string) (e existing, found bool, err error) {
	err = s.pool.QueryRow(ctx, `
SELECT request_hash, status, coalesce(response_body, ''), coalesce(lease_until > now(), false)
FROM gateway.charges WHERE idempotency_key = $1`, key).Scan(&e.requestHash, &e.status, &e.body, &e.live)
	if errors.Is(err, pgx.ErrNoRows) {
		return existing{}, false, nil
	}
	if err != nil {
		return existing{}, false, fmt.Errorf("read key: %w", err)
	}
	return e, true, nil
}

// takeOver gives an expired processing row to the call under a new token;
// false when the row is no longer processing with an expired lease.
func (s store) takeOver(ctx context.Context, key, token string, lease time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE gateway.charges
SET lease_token = $2, lease_until = now() + $3 * interval '1 millisecond'
WHERE idempotency_key = $1 AND status = 'processing' AND lease_until <= now()`,
		key, token, lease.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("take over key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// renew extends the hold of the call holding key under token by lease from
// now; false when the call no longer holds it (taken over, or final).
func (s store) renew(ctx context.Context, key, token string, lease time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE gateway.charges SET lease_until = now() + $3 * interval '1 millisecond'
WHERE idempotency_key = $1 AND lease_token = $2 AND status = 'processing'`,
		key, token, lease.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("renew the hold on key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// now returns the database's clock: charges are dated by Postgres, whatever
// the gateway process's clock says.
func (s store) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the time: %w", err)
	}
	return t, nil
}

// charge makes the charge: the row turns final with its answer's body, in
// one statement, fenced by the call's lease token. False when the call no
// longer holds the key (its lease was taken over).
func (s store) charge(ctx context.Context, key, token, status, chargeID string, chargedAt time.Time, body []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE gateway.charges
SET status = $3, charge_id = $4, charged_at = $5, response_body = $6, lease_token = NULL, lease_until = NULL
WHERE idempotency_key = $1 AND lease_token = $2 AND status = 'processing'`,
		key, token, status, chargeID, chargedAt, string(body))
	if err != nil {
		return false, fmt.Errorf("charge: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// release gives the key up without a charge (the call was cut short), so
// the next call with it runs at once.
func (s store) release(ctx context.Context, key, token string) error {
	if _, err := s.pool.Exec(ctx, `
DELETE FROM gateway.charges WHERE idempotency_key = $1 AND lease_token = $2 AND status = 'processing'`,
		key, token); err != nil {
		return fmt.Errorf("release key: %w", err)
	}
	return nil
}

// lookup returns the stored bodies of every final charge of reference, in
// the order they were made, and how many calls for it are still in flight
// (they may charge yet).
func (s store) lookup(ctx context.Context, reference string) (bodies []string, inFlight int, err error) {
	rows, err := s.pool.Query(ctx, `
SELECT status, coalesce(response_body, '') FROM gateway.charges
WHERE reference = $1
ORDER BY charged_at NULLS LAST, charge_id`, reference)
	if err != nil {
		return nil, 0, fmt.Errorf("look up charges: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var status, body string
		if err := rows.Scan(&status, &body); err != nil {
			return nil, 0, fmt.Errorf("look up charges: %w", err)
		}
		if status == "processing" {
			inFlight++
			continue
		}
		bodies = append(bodies, body)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("look up charges: %w", err)
	}
	return bodies, inFlight, nil
}
