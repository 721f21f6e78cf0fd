package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/demotest"
	"github.com/onceonly/onceonly/oncetest"
)

var _ = demotest.Gateway // its import gives the test databases the payments table

// TestCountPaymentFailsOnASecondRow: the crash and message steps count the
// payments rows of their key, and a second row fails the tour.
func TestCountPaymentFailsOnASecondRow(t *testing.T) {
	url := oncetest.DatabaseURL(t)
	pool := oncetest.Pool(t, url)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
		VALUES ('pay_1', 'acct_demo', 'once', 5, 'usd', 'c', 'succeeded'),
		       ('pay_2', 'acct_demo', 'twice', 5, 'usd', 'c', 'succeeded'),
		       ('pay_3', 'acct_demo', 'twice', 5, 'usd', 'c', 'succeeded')`)
	require.NoError(t, err)
	tr := &tour{databaseURL: url}
	id, err := tr.countPayment(ctx, "once")
	require.NoError(t, err)
	require.Equal(t, "pay_1", id)
	_, err = tr.countPayment(ctx, "twice")
	require.ErrorContains(t, err, "2 payments rows for key twice: executed more than once")
}
