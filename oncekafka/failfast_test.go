package oncekafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncekafka"
)

// An engine whose schema is gone (rolled back after New): Run stops with
// ErrSchemaBehind, which names the fix; the record is left to the group,
// neither dead-lettered nor committed over, for the member that runs once
// it is fixed.
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := oncekafka.NewConsumer(b.engine, effect, b.options())
	require.NoError(t, err)
	first := b.produce(t, 0, "order-1", `{"amount":100}`)
	b.produce(t, 0, "order-2", `{"amount":200}`)
	_, err = b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.NoError(t, ctx.Err(), "Run stopped by itself")
	require.Empty(t, b.deadLetters(t))
	off, ok := b.committed(t)[0]
	require.True(t, !ok || off <= first, "no offset committed over the record: %d", off)
	require.GreaterOrEqual(t, b.count(t, "retry", "stopped"), 1)
	require.Zero(t, b.count(t, "retry", "error"), "not retried")
}
