package relay

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestBacklogGauges: the relay's count reports the events waiting, the
// parked ones and the age of the oldest waiting one, which grows while
// nothing delivers it (no relay runs here but the count).
func TestBacklogGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO outbox (scope, key, version, created_at) VALUES ('m', 'old', 1, now() - interval '90 seconds'), ('m', 'new', 1, now());
		INSERT INTO outbox (scope, key, version, attempts, parked_at, last_error) VALUES ('m', 'p', 1, 10, now(), 'refused')`)
	require.NoError(t, err)
	r := b.relay(t, Config{})
	ctx, cancel := context.WithCancel(b.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.countEvents(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	oncetest.Eventually(t, 10*time.Second, "the first count", func() bool {
		return testutil.ToFloat64(r.metrics.pendingEvents) == 2
	})
	require.InDelta(t, 1, testutil.ToFloat64(r.metrics.parkedEvents), 0)
	require.GreaterOrEqual(t, testutil.ToFloat64(r.metrics.oldestPending), 90.0)
	require.Less(t, testutil.ToFloat64(r.metrics.oldestPending), 120.0)
}
