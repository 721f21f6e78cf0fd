package reconcile

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestStuckExecutionsAreCounted: a key in progress whose lease ran out is
// reaped when no step started, and counted as stuck (not reaped) when one
// did, in the report and in onceonly_reconcile_stuck_executions.
func TestStuckExecutionsAreCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at, steps, handler)
		VALUES ('m', 'stepped', 'in_progress', 1, 'v1:x', gen_random_uuid(), now() - interval '1 minute', now() + interval '1 hour', '{"charge":{}}', 'h'),
		       ('m', 'running', 'in_progress', 1, 'v1:x', gen_random_uuid(), now() + interval '1 minute', now() + interval '1 hour', '{"charge":{}}', 'h'),
		       ('m', 'dead', 'in_progress', 1, 'v1:x', gen_random_uuid(), now() - interval '1 minute', now() + interval '1 hour', NULL, NULL)`)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	r := b.reconciler(t, Config{Registerer: reg})
	dry := b.pass(t, r, true)
	require.EqualValues(t, 1, dry.StuckExecutions)
	rep := b.pass(t, r, false)
	require.EqualValues(t, 1, rep.StuckExecutions, "the stepped key past its lease, not the running one")
	require.EqualValues(t, 1, rep.LeasesReaped, "the key without a step is reaped")
	require.InDelta(t, 1, testutil.ToFloat64(r.metrics.stuck), 0)
	n, err := testutil.GatherAndCount(reg, "onceonly_reconcile_stuck_executions")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
