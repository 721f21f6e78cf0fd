package onceonly_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

// TestMiddlewareGuardsItsMethodsOnly: POST and PATCH need a key and run
// once; GET and DELETE pass through untouched; with KeyOptional a request
// without a key passes through too, and one with a key is still guarded.
func TestMiddlewareGuardsItsMethodsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	scope := func(*http.Request) (string, error) { return "tenant", nil }
	strict := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: scope})(handler))
	t.Cleanup(strict.Close)
	optional := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: scope, KeyOptional: true})(handler))
	t.Cleanup(optional.Close)

	type answer struct {
		StatusCode int
		Header     http.Header
	}
	send := func(url, method, key string) answer {
		t.Helper()
		req, err := http.NewRequestWithContext(b.ctx, method, url, strings.NewReader(`{"a":1}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(onceonly.HeaderKey, key)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		return answer{res.StatusCode, res.Header}
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete, http.MethodPut} {
		require.Equal(t, http.StatusCreated, send(strict.URL, method, "").StatusCode, method+" passes through")
	}
	require.EqualValues(t, 3, runs.Load())
	require.Equal(t, http.StatusBadRequest, send(strict.URL, http.MethodPost, "").StatusCode, "a guarded POST needs a key")
	require.Equal(t, http.StatusBadRequest, send(strict.URL, http.MethodPatch, "").StatusCode)
	require.EqualValues(t, 3, runs.Load())

	require.Equal(t, http.StatusCreated, send(optional.URL, http.MethodPost, "").StatusCode, "no key: passes through")
	require.EqualValues(t, 4, runs.Load())
	first := send(optional.URL, http.MethodPost, "mw-1")
	again := send(optional.URL, http.MethodPost, "mw-1")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, "true", again.Header.Get(onceonly.HeaderReplayed), "a key present is still guarded")
	require.EqualValues(t, 5, runs.Load())
	require.Equal(t, http.StatusBadRequest, send(optional.URL, http.MethodPost, "bad key").StatusCode, "a present key is validated")
}
