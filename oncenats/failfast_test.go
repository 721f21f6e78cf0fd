package oncenats_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncenats"
)

// An engine whose schema is gone (rolled back after New): Run stops with
// ErrSchemaBehind, which names the fix; the message is handed back, not
// dead-lettered, and comes to the consumer that runs once it is fixed.
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
	require.NoError(t, err)
	c, err := oncenats.NewConsumer(b.engine, effect, b.options())
	require.NoError(t, err)
	b.publish(t, "order-1", `{"amount":100}`)

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.NoError(t, ctx.Err(), "Run stopped by itself")
	require.Empty(t, b.deadLetters(t))
	require.Empty(t, b.retries(), "not settled: handed back")
	require.Zero(t, b.info(t).AckFloor.Stream, "the message is not acked: it is still the stream's")
}
