package oncetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx begins a transaction on pool that is rolled back when the test ends:
// a test whose statements all run in it leaves nothing behind and needs no
// database of its own. Statements that must commit (LISTEN/NOTIFY, other
// connections' views) need DB instead.
func Tx(tb testing.TB, pool *pgxpool.Pool) pgx.Tx {
	tb.Helper()
	tx, err := pool.Begin(tb.Context())
	if err != nil {
		tb.Fatalf("begin: %v", err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(tb.Context())) })
	return tx
}
