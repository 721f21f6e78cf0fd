package reconcile

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// setupBouncer returns a stack whose pool reaches the test's database
// through PgBouncer in transaction mode, in pgx query mode mode.
func setupBouncer(t *testing.T, mode string) *bundle {
	t.Helper()
	return setup(t, oncetest.OnPool(oncetest.Pool(t, oncetest.PgBouncerURL(t, oncetest.DatabaseURL(t), mode))))
}

// TestPassesThroughPgBouncer: behind PgBouncer in transaction mode every
// pass runs (a session lock would stay on whichever server connection took
// it, and every later pass would be skipped), reaps, expires and repairs,
// and racing passes still never overlap.
func TestPassesThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setupBouncer(t, mode)
			for i := range 20 {
				b.complete(t, fmt.Sprintf("k%d", i))
			}
			_, err := b.Store.Claim(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"}, "v1:fp", owner, time.Millisecond)
			require.NoError(t, err)
			_, err = b.Pool.Exec(b.Ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1s' WHERE key = 'k0'`)
			require.NoError(t, err)
			oncetest.AwaitLeaseOver(t, b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "dead"}, time.Millisecond)

			r := b.reconciler(t, Config{ReapGrace: time.Millisecond, PageSize: 7})
			first := b.pass(t, r, false)
			require.False(t, first.Skipped)
			require.EqualValues(t, 1, first.LeasesReaped)
			require.EqualValues(t, 1, first.ExpiredDeleted)
			require.EqualValues(t, 20, first.Missing)
			require.EqualValues(t, 20, first.Repaired)
			for range 3 {
				rep := b.pass(t, r, false)
				require.False(t, rep.Skipped, "the lock of the pass before is gone")
				require.EqualValues(t, 20, rep.Scanned)
				require.EqualValues(t, 20, rep.InSync)
			}
			b.RequireConverged(t)

			// Racing passes: the lock still admits one at a time.
			var wg sync.WaitGroup
			var active, overlaps, ran atomic.Int32
			for range 4 {
				rr := b.reconciler(t, Config{})
				rr.inPass = func() {
					if active.Add(1) > 1 {
						overlaps.Add(1)
					}
					time.Sleep(50 * time.Millisecond) // a pass that takes a while, so racing passes would overlap it
					active.Add(-1)
				}
				wg.Go(func() {
					rep, err := rr.Pass(b.Ctx, false)
					if err == nil && !rep.Skipped {
						ran.Add(1)
					}
				})
			}
			wg.Wait()
			require.Positive(t, ran.Load())
			require.Zero(t, overlaps.Load(), "passes never overlap")
		})
	}
}
