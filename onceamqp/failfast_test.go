package onceamqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncetest"
)

// An engine whose schema is gone (rolled back after New): Run stops with
// ErrSchemaBehind, which names the fix, and the message stays in the
// queue, neither redelivered in a loop nor dead-lettered.
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
	require.NoError(t, err)
	c, err := onceamqp.NewTxConsumer(b.engine, recordEffect, b.options(onceamqp.Options{}))
	require.NoError(t, err)
	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.NoError(t, ctx.Err(), "Run stopped by itself")
	require.ErrorIs(t, c.Err(), onceonly.ErrSchemaBehind)
	// The broker requeues the channel's deliveries as it closes, a moment
	// after Run returned.
	oncetest.Eventually(t, 5*time.Second, "the message is back in the queue", func() bool { return b.ready(t, b.queue.Name) == 1 })
	require.Zero(t, b.ready(t, b.queue.DeadLetterQueue))
	require.Zero(t, b.settled(t, "dead_letter", "invalid")+b.settled(t, "dead_letter", "failed"))
}
