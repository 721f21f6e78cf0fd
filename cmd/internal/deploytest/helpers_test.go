package deploytest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// payment is a handler that records one payment per execution and answers
// 201 with body.
func payment(body string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', 'k', 100, 'usd', 'c', 'succeeded')`); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: 201, ContentType: "application/json", Body: []byte(body)}, nil
	}
}

// awaitOutboxDrained waits up to timeout until the relay has delivered
// every event of pool's outbox.
func awaitOutboxDrained(t *testing.T, ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) {
	t.Helper()
	oncetest.Eventually(t, timeout, "the outbox drained", func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
}
