package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
)

// TestRecreatedKeyOutranksACopyOfItsEarlierLife: a key deleted by retention
// is created again and completed with other content, and Redis comes back
// with a copy of the key's earlier life (a restored snapshot, a lagging
// replica promoted). The current row's version is higher, so the pass sees
// the copy as stale and replaces it: "same version, other content" cannot
// happen.
func TestRecreatedKeyOutranksACopyOfItsEarlierLife(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ref := keystate.Ref{Scope: "s", Key: "k"}
	live := func(fp, body string) keystate.Key {
		t.Helper()
		_, err := b.Store.Claim(b.Ctx, b.Pool, ref, fp, owner, time.Minute)
		require.NoError(t, err)
		k, err := b.Store.Complete(b.Ctx, b.Pool, ref, owner, keystate.Response{Status: 201, Body: []byte(body)})
		require.NoError(t, err)
		_, err = b.Cache.Apply(b.Ctx, k)
		require.NoError(t, err)
		return k
	}
	first := live("v1:first", `{"life":1}`)
	earlier := b.raw(t, "k")
	_, _, err := b.Store.Purge(b.Ctx, b.Pool, ref, false)
	require.NoError(t, err)
	r := b.reconciler(t, Config{})
	rep := b.pass(t, r, false)
	require.EqualValues(t, 1, rep.ExpiredDeleted)

	second := live("v1:second", `{"life":2}`)
	require.Greater(t, second.Version, first.Version+1)
	b.set(t, b.Cache.Key(ref), earlier) // Redis restored from a snapshot of the earlier life

	rep = b.pass(t, r, false)
	require.EqualValues(t, 1, rep.Stale)
	require.EqualValues(t, 1, rep.Repaired)
	e, found, err := b.Cache.Read(b.Ctx, ref)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, second.Version, e.Version)
	require.JSONEq(t, `{"life":2}`, string(e.Response.Body))
}
