package reconcile

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

func TestPassesAreRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "k1")
	r := b.reconciler(t, Config{})
	rep := b.pass(t, r, false)
	require.Equal(t, int64(1), rep.Missing, "the key never reached Redis")
	b.pass(t, r, true) // a dry run changes nothing, so it is not recorded

	rows, err := b.Pool.Query(b.Ctx, `SELECT result, report::text, coalesce(error, ''), finished_at >= started_at FROM reconcile_passes ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var n int
	for rows.Next() {
		var result, report, errText string
		var ordered bool
		require.NoError(t, rows.Scan(&result, &report, &errText, &ordered))
		var got Report
		require.NoError(t, json.Unmarshal([]byte(report), &got))
		require.Equal(t, "ok", result)
		require.Empty(t, errText)
		require.True(t, ordered)
		require.Equal(t, rep.Missing, got.Missing)
		require.Equal(t, rep.Scanned, got.Scanned)
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n)

	// The table keeps the last passes only.
	for range outbox.KeptPasses + 5 {
		require.NoError(t, r.store.RecordPass(b.Ctx, b.Pool, outbox.Pass{Result: "ok", Report: []byte("{}")}))
	}
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM reconcile_passes`).Scan(&n))
	require.Equal(t, outbox.KeptPasses, n)
}

func TestAFailedPassIsRecordedWithItsError(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: oncetest.FreeAddr(t), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	b := setup(t, oncetest.OnRedis(dead))
	b.complete(t, "k1")
	_, err := b.reconciler(t, Config{}).Pass(b.Ctx, false)
	require.Error(t, err)
	var result, errText string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT result, error FROM reconcile_passes`).Scan(&result, &errText))
	require.Equal(t, "failed", result)
	require.Contains(t, errText, "reconcile")
}
