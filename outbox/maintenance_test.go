package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
)

// TestScanLiveReadsEachRowOnce: rows updated while the scan streams move to
// the end of the table (a non-HOT update: expires_at is indexed), where a
// scan without one snapshot would read them a second time; expired rows are
// left out.
func TestScanLiveReadsEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Enough rows (and long enough keys, 10 MB in all) that the server is
	// still scanning when the first rows arrive.
	const rows = 50000
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, expires_at)
		SELECT 's', 'k' || i || repeat('x', 200), 'completed', 2, 'v1:fp', 200, now() + interval '1 hour' FROM generate_series(1, $1) i`, rows)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key LIKE 'k7x%'`)
	require.NoError(t, err)

	seen := make(map[string]int, rows)
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.store.ScanLive(b.ctx, tx, func(k keystate.Key) error {
			if len(seen) == 0 {
				var scanning bool
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE datname = current_database() AND state = 'active' AND query LIKE '-- scan_live%')`).Scan(&scanning))
				require.True(t, scanning, "the scan statement is still running")
				// Every row gets a new version at the end of the table.
				tag, err := b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET expires_at = expires_at + interval '1 second', version = version + 1 WHERE key NOT LIKE 'k7x%'`)
				require.NoError(t, err)
				require.EqualValues(t, rows-1, tag.RowsAffected())
			}
			require.Equal(t, keystate.Completed, k.Status)
			require.EqualValues(t, 2, k.Version, "the rows as the scan's snapshot saw them")
			seen[k.Key]++
			return nil
		})
	})
	require.NoError(t, err)
	require.Len(t, seen, rows-1, "every live row, the expired one left out")
	for key, n := range seen {
		require.Equal(t, 1, n, "%s read once", key)
	}
}
