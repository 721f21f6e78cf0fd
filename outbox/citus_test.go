//go:build citus

// The store's tests on Citus (docs/citus.md), run by `make test-citus` (go test
// -tags citus) against the cluster whose coordinator TEST_CITUS_URL names:
// each test gets a database of its own on every node, migrated as `api
// migrate up` does, so the engine's tables are distributed by scope. The
// tests are those of one Postgres; the store finds out by itself that the
// tables are distributed. Without TEST_CITUS_URL they fail.

package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// citusBundle is a test bundle on a migrated Citus database of the test's
// own, its store detecting the distribution.
func citusBundle(t *testing.T, cfg outbox.Config) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.Pool(t, oncetest.MigratedCitusURL(t)), store: outbox.New(cfg)}
	d, err := b.store.Distribution(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.ByScope, d, "api migrate up distributed idempotency_keys")
	return b
}

// TestCitusEveryStatement runs every store method on Citus, in pgx's query
// modes but simple_protocol: pgx sends a batch in that mode as one string
// of statements, and Citus 13.2 forwards such a string whole to a worker
// ("cannot execute a distributed query from a query on a shard"), so the
// claim batches, which go scope by scope in transactions of their own,
// fail in it. Behind PgBouncer in transaction mode, use exec.
func TestCitusEveryStatement(t *testing.T) {
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) {
			ctx := oncetest.Context(t)
			exerciseStore(t, ctx, oncetest.Pool(t, withQueryMode(t, oncetest.MigratedCitusURL(t), mode)))
		})
	}
}

// TestCitusTakeBatch: the relay's take on Citus, scope by scope.
func TestCitusTakeBatch(t *testing.T) {
	b := citusBundle(t, outbox.Config{})
	exerciseTakeBatch(t, b.ctx, b.pool)
}

// TestCitusConcurrentTakes: relays on Citus never take the same event.
func TestCitusConcurrentTakes(t *testing.T) {
	b := citusBundle(t, outbox.Config{})
	exerciseConcurrentTakes(t, b.ctx, b.pool, outbox.DetectDistribution)
}

// TestCitusClaimNewGivesUpWaiting: a claim batch's lock_timeout reaches
// the shard's session (a batch that met an uncommitted key waited 5 s,
// Citus's own timeout, when the setting stayed on the coordinator).
func TestCitusClaimNewGivesUpWaiting(t *testing.T) {
	exerciseGivesUpWaiting(t, citusBundle(t, outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute, DeferNotify: true}))
}

// TestCitusClaimNewNeverDeadlocks: claim batches on Citus meet on the same
// keys without a deadlock.
func TestCitusClaimNewNeverDeadlocks(t *testing.T) {
	exerciseNeverDeadlocks(t, citusBundle(t, outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute}))
}

// TestCitusSingleCommitAboveFloor is TestSingleCommitAboveFloor on Citus,
// where the floor is read with the key's probe and the row is an INSERT …
// VALUES routed to the key's shard.
func TestCitusSingleCommitAboveFloor(t *testing.T) {
	b := citusBundle(t, outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute})
	exerciseSingleAboveFloor(t, b.ctx, b.pool, b.store)
}
