package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestHarnessSmoke runs every variant the side-by-side benchmark compares,
// on real servers (a private Redis: dupes flushes it). Each answers a first
// execution and a retry; the idempotent ones replay the first answer; under
// retries with the cache flushed midway, the variants that keep keys in
// Postgres charge no key twice.
func TestHarnessSmoke(t *testing.T) {
	ctx := oncetest.Context(t)
	rdb := oncetest.RedisClient(t, oncetest.NewRedisServer(t).URL())
	h, err := newHarness(oncetest.DB(t), rdb)
	require.NoError(t, err)
	require.NoError(t, h.seed(ctx))

	post := func(url string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "smoke-1")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	for i, handler := range h.handlers() {
		srv := httptest.NewServer(handler)
		firstStatus, first := post(srv.URL)
		againStatus, again := post(srv.URL)
		srv.Close()
		require.Less(t, firstStatus, 300, "variant %d: %s", i, first)
		require.Equal(t, firstStatus, againStatus, "variant %d", i)
		if i >= 2 { // (c) onwards are idempotent
			require.Equal(t, first, again, "variant %d must replay", i)
		}
	}

	const n = 40
	result, err := h.dupes(ctx, n)
	require.NoError(t, err)
	for _, name := range []string{"d_postgres_only", "e_onceonly", "e_onceonly_notify_in_tx"} {
		require.Equal(t, n, result[name].KeysCharged, name)
		require.Zero(t, result[name].KeysChargedTwice, name)
	}

	usage, err := h.memory(ctx)
	require.NoError(t, err)
	require.Positive(t, usage["completed_key_bytes"])
	require.Positive(t, usage["in_progress_key_bytes"])
}
