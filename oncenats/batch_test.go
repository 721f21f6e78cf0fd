package oncenats_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

// TestBatchesCommitTogether: a backlog is run in batches — many keys
// completed by one transaction — and a message that fails or panics in a
// batch comes back alone while the rest of its batch is acked; every
// message's effect commits once.
func TestBatchesCommitTogether(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const messages = 48
	b.publishBacklog(t, messages)
	flaky := &oncetest.Flaky{Fail: "order-7", Panic: "order-11"}
	opts := b.options()
	opts.Workers, opts.BatchSize, opts.BatchLinger = 2, 16, 200*time.Millisecond
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		if err := effect(ctx, msg); err != nil {
			return err
		}
		return flaky.Try(msg.Key)
	}, opts)

	b.awaitSettled(t, 30*time.Second)
	require.Equal(t, messages, b.effectRows(t))
	var dupes, txs int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d),
		count(DISTINCT xmin::text) FROM idempotency_keys`).Scan(&dupes, &txs))
	require.Zero(t, dupes, "an effect committed twice")
	require.Less(t, txs, messages/2, "the keys were completed in batches")
	require.Equal(t, 2, b.count(t, "retry", "failed"))
	require.Equal(t, messages, b.count(t, "ack", "executed"))
	require.Equal(t, 2, flaky.Tries("order-7"))
	require.Equal(t, 2, flaky.Tries("order-11"))
}

// TestBatchedStepRunsAlone: a handler that calls Step inside a batch is
// refused before its call goes out, and its message runs again alone,
// where the step runs once.
func TestBatchedStepRunsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.publishBacklog(t, 8)
	var (
		mu      sync.Mutex
		calls   int
		refused int
	)
	opts := b.options()
	opts.Workers, opts.BatchSize, opts.BatchLinger = 1, 8, 200*time.Millisecond
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		if msg.Key == "order-3" {
			_, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				return calls, nil
			})
			if errors.Is(err, onceonly.ErrStepInBatch) {
				mu.Lock()
				refused++
				mu.Unlock()
			}
			if err != nil {
				return err
			}
		}
		return effect(ctx, msg)
	}, opts)

	b.awaitSettled(t, 30*time.Second)
	require.Equal(t, 8, b.effectRows(t))
	require.Equal(t, 1, calls)
	require.Equal(t, 1, refused)
	require.Equal(t, 8, b.count(t, "ack", "executed"))
}
