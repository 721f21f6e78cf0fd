package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
)

// TestVersionsNeverRepeat: a key that retention deleted and a request
// creates again starts above every version it reached before, so no copy of
// its earlier life (in Redis, in an event) can pass for its current row.
func TestVersionsNeverRepeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref := keystate.Ref{Scope: "s", Key: "k"}
	_, err := b.store.Claim(b.ctx, b.pool, ref, "v1:first", ownerA, time.Minute)
	require.NoError(t, err)
	_, err = b.store.Complete(b.ctx, b.pool, ref, ownerA, keystate.Response{Status: 201, Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	purged, _, err := b.store.Purge(b.ctx, b.pool, ref, false)
	require.NoError(t, err)
	require.Equal(t, int64(3), purged.Version)
	n, err := b.store.DeleteExpired(b.ctx, b.pool, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	res, err := b.store.Claim(b.ctx, b.pool, ref, "v1:second", ownerB, time.Minute)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Greater(t, res.Key.Version, purged.Version, "a version of the earlier life is never reused")
	k, err := b.store.Complete(b.ctx, b.pool, ref, ownerB, keystate.Response{Status: 201, Body: []byte(`{"n":2}`)})
	require.NoError(t, err)
	require.Greater(t, k.Version, res.Key.Version)
}
