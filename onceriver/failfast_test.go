package onceriver_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An engine whose schema is gone (rolled back after New): the worker stops
// the River client and snoozes the job, which is neither cancelled nor
// discarded and records no error.
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	client := b.start(t, ledgerWorker(t, b, &runs, nil))
	_, err := b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
	require.NoError(t, err)
	ids := b.insert(t, client, order("order-1", 100))

	select {
	case <-client.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("the River client did not stop within 30s")
	}
	row, err := client.JobGet(b.ctx, ids[0])
	require.NoError(t, err)
	require.False(t, slices.Contains(finalStates, row.State), "the job waits: %s", row.State)
	require.Empty(t, row.Errors, "no attempt failed")
	require.Zero(t, runs.Load(), "the handler never ran")
}
