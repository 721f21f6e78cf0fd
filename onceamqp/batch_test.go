package onceamqp_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncetest"
)

// TestBatchesCommitTogether: a backlog is run in batches — many keys
// completed by one transaction — and a delivery that fails or panics in a
// batch comes back alone while the rest of its batch is acked; every
// message's effect commits once.
func TestBatchesCommitTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const messages = 40
	ch := b.channel(t)
	for i := range messages {
		b.publish(t, ch, "order-"+strconv.Itoa(i), `{"amount":`+strconv.Itoa(i+1)+`}`)
	}
	flaky := &oncetest.Flaky{Fail: "order-7", Panic: "order-11"}
	b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		if err := writeEffect(ctx, msg); err != nil {
			return err
		}
		return flaky.Try(msg.Key)
	}, onceamqp.Options{Workers: 2, BatchSize: 16, BatchLinger: 200 * time.Millisecond})

	b.awaitSettled(t, messages, "ack", "executed")
	for i := range messages {
		require.Len(t, b.effects(t, "order-"+strconv.Itoa(i)), 1)
	}
	var txs int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT xmin::text) FROM idempotency_keys`).Scan(&txs))
	require.Less(t, txs, messages/2, "the keys were completed in batches")
	require.Equal(t, 2, b.settled(t, "retry", "failed"))
	require.Equal(t, 2, flaky.Tries("order-7"))
	require.Equal(t, 2, flaky.Tries("order-11"))
}
