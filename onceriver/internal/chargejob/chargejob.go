// Package chargejob is the River job the onceriver tests work: charge an
// order at the demo gateway through a step, then write one ledger row with
// the charge in the final transaction. The test worker program and the
// tests share it.
package chargejob

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/gateway"
)

// Kind is the job kind of Args.
const Kind = "charge_order"

// Args are a charge job's args; OrderID is the logical message's key.
type Args struct {
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Kind implements river.JobArgs.
func (Args) Kind() string { return Kind }

// IdempotencyKey implements onceriver.Keyed.
func (a Args) IdempotencyKey() string { return a.OrderID }

// Reference is the gateway reference of an order's charge.
func Reference(orderID string) string { return "river/" + orderID }

// Migrate creates the ledger table: deliberately without a unique
// constraint, so a second row for an order shows up instead of failing.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (
		id        bigserial PRIMARY KEY,
		order_id  text NOT NULL,
		charge_id text NOT NULL,
		amount    bigint NOT NULL
	)`)
	if err != nil {
		return fmt.Errorf("create ledger: %w", err)
	}
	return nil
}

// Handler returns the job's work: the charge as a step, a pause (to let a
// test land a kill between the charge and the commit), then the ledger row
// through onceonly.Tx.
func Handler(gw *gateway.Client, pause time.Duration) func(ctx context.Context, args Args) error {
	return func(ctx context.Context, args Args) error {
		charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (gateway.Charge, error) {
			return gw.Charge(ctx, key, gateway.ChargeRequest{
				Amount: args.Amount, Currency: args.Currency, Source: gateway.SourceVisa, Reference: Reference(args.OrderID),
			})
		})
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pause after the charge: %w", ctx.Err())
		case <-time.After(pause):
		}
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, charge_id, amount) VALUES ($1, $2, $3)`,
			args.OrderID, charge.ID, args.Amount); err != nil {
			return fmt.Errorf("insert ledger row: %w", err)
		}
		return nil
	}
}
