package onceonly_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

const insertPayment = `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
	VALUES ($1, 'm', 'k', 100, 'usd', 'c', 'succeeded')`

// TestTxFirstStatementOfEveryKind: whichever method sends the handler's
// first statement (and so its BEGIN), the transaction is one: its writes
// commit with the key's completion, and a later failure rolls them all
// back.
func TestTxFirstStatementOfEveryKind(t *testing.T) {
	b := setup(t, setupOpts{})
	first := map[string]func(ctx context.Context, tx pgx.Tx, id string) error{
		"exec": func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, insertPayment, id)
			return err
		},
		"query": func(ctx context.Context, tx pgx.Tx, id string) error {
			rows, err := tx.Query(ctx, insertPayment+` RETURNING id`, id)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil {
				require.Equal(t, []string{id}, got)
			}
			return err
		},
		"query-row": func(ctx context.Context, tx pgx.Tx, id string) error {
			var got string
			err := tx.QueryRow(ctx, insertPayment+` RETURNING id`, id).Scan(&got)
			require.Equal(t, id, got)
			return err
		},
		"batch": func(ctx context.Context, tx pgx.Tx, id string) error {
			batch := &pgx.Batch{}
			batch.Queue(insertPayment, id)
			batch.Queue(`SELECT 1`)
			return tx.SendBatch(ctx, batch).Close()
		},
		"savepoint": func(ctx context.Context, tx pgx.Tx, id string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insertPayment, id); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"copy": func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"},
				[]string{"id", "merchant_id", "idempotency_key", "amount", "currency", "customer", "status"},
				pgx.CopyFromRows([][]any{{id, "m", "k", int64(100), "usd", "c", "succeeded"}}))
			return err
		},
	}
	for name, write := range first {
		t.Run(name, func(t *testing.T) {
			// Committed with the key.
			out, err := b.engine.Do(b.ctx, "s", name, nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				if err := write(ctx, tx, name+"-1"); err != nil {
					return onceonly.Result{}, err
				}
				_, err := tx.Exec(ctx, insertPayment, name+"-2")
				return onceonly.Result{Status: 201}, err
			})
			require.NoError(t, err)
			require.Equal(t, 201, out.Status)
			require.Equal(t, "completed", b.keyStatus(t, name))
			require.Equal(t, 2, b.countPayments(t, name+"-1", name+"-2"))

			// Rolled back with the failure that follows.
			_, err = b.engine.Do(b.ctx, "s", name+"-failed", nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				if err := write(ctx, tx, name+"-failed-1"); err != nil {
					return onceonly.Result{}, err
				}
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return onceonly.Result{Status: 201}, err
			})
			require.ErrorContains(t, err, "division by zero")
			require.Equal(t, "failed", b.keyStatus(t, name+"-failed"))
			require.Zero(t, b.countPayments(t, name+"-failed-1"))
		})
	}
}

// TestTxHandlerCannotCommit: the engine commits the execution's
// transaction, with the key; a handler's own Commit is refused and commits
// nothing.
func TestTxHandlerCannotCommit(t *testing.T) {
	b := setup(t, setupOpts{})
	var commitErr error
	_, err := b.engine.Do(b.ctx, "s", "k", nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := tx.Exec(ctx, insertPayment, "p1"); err != nil {
			return onceonly.Result{}, err
		}
		commitErr = tx.Commit(ctx)
		return onceonly.Result{}, commitErr
	})
	require.ErrorIs(t, commitErr, onceonly.ErrCommitByHandler)
	require.ErrorIs(t, err, onceonly.ErrCommitByHandler)
	require.Zero(t, b.countPayments(t, "p1"))
	require.Equal(t, "failed", b.keyStatus(t, "k"))
}

// TestTxIgnoredErrorDoesNotComplete: a handler that swallows the error of
// a statement and returns a Result leaves an aborted transaction; the
// completion sent with the COMMIT fails, and the key is failed, not
// completed without its writes.
func TestTxIgnoredErrorDoesNotComplete(t *testing.T) {
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(b.ctx, "s", "k", nil, func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		_, _ = tx.Exec(ctx, insertPayment, "p1")
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return onceonly.Result{Status: 201}, nil
	})
	require.ErrorIs(t, err, onceonly.ErrUnavailable)
	require.Zero(t, b.countPayments(t, "p1"))
	require.Equal(t, "failed", b.keyStatus(t, "k"))
}

// countPayments counts the payments with these ids. The ids are named
// exactly: a pattern such as "query-%" would count the rows of
// "query-row" too.
func (b *testBundle) countPayments(t *testing.T, ids ...string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments WHERE id = ANY($1)`, ids).Scan(&n))
	return n
}
