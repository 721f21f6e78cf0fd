package onceonly_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// TestMiddlewareKeepsNoCredentialsForAResumption: the request a named
// handler's key keeps for its resumption (which the console shows and a
// resumption replays) holds no credential-like header by default —
// Authorization, Cookie, X-Api-Key, X-Auth-Token, X-Amz-Security-Token,
// X-CSRF-Token — and the resumption runs with the others;
// StoreRequestHeaders keeps exactly the headers it names.
func TestMiddlewareKeepsNoCredentialsForAResumption(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{lease: 2 * time.Second})
	sent := http.Header{
		"Authorization": {"Bearer sk_live"}, "Proxy-Authorization": {"Basic eA=="}, "Cookie": {"sid=1"},
		"X-Api-Key": {"ak"}, "X-Auth-Token": {"at"}, "X-Amz-Security-Token": {"st"}, "X-Csrf-Token": {"ct"},
		"X-Session-Id": {"si"}, "X-Hub-Signature-256": {"sha256=0"},
		"X-Region": {"eu"}, "X-Request-Id": {"r1"},
	}
	for _, c := range []struct {
		name string
		keep []string
		kept []string // the header names kept, sorted
	}{
		{"default", nil, []string{onceonly.HeaderKey, "X-Region", "X-Request-Id"}},
		{"allow-list", []string{"x-region", "X-Api-Key", "X-Absent"}, []string{"X-Api-Key", "X-Region"}},
	} {
		var runs atomic.Int32
		var resumed http.Header
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			run := runs.Add(1)
			if _, err := onceonly.Step(r.Context(), "call", func(context.Context, string) (int, error) {
				if run == 1 {
					return 0, errors.New("outcome unknown") // handed off for a resumption
				}
				return 1, nil
			}); err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			resumed = r.Header.Clone()
			w.WriteHeader(http.StatusCreated)
		})
		mw := b.engine.Middleware(onceonly.MiddlewareOptions{
			Scope: func(*http.Request) (string, error) { return "tenant", nil }, Name: "creds-" + c.name, StoreRequestHeaders: c.keep,
		})(handler)
		req := httptest.NewRequestWithContext(b.ctx, http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header = sent.Clone()
		req.Header.Set(onceonly.HeaderKey, c.name)
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		require.Equal(t, http.StatusBadGateway, rec.Code, c.name)

		var raw []byte
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT request FROM idempotency_keys WHERE scope = 'tenant' AND key = $1`, c.name).Scan(&raw), c.name)
		var stored struct {
			Header http.Header `json:"header"`
		}
		require.NoError(t, json.Unmarshal(raw, &stored), c.name)
		require.Equal(t, c.kept, slices.Sorted(maps.Keys(stored.Header)), "%s: the headers kept", c.name)

		n, err := b.engine.ResumeOnce(b.ctx)
		require.NoError(t, err, c.name)
		require.Equal(t, 1, n, c.name)
		require.Equal(t, "completed", b.keyStatus(t, c.name), "%s: the resumption ran on the kept request", c.name)
		require.Equal(t, "eu", resumed.Get("X-Region"), c.name)
		require.Equal(t, slices.Sorted(maps.Keys(stored.Header)), slices.Sorted(maps.Keys(resumed)), "%s: the resumption sees the kept headers only", c.name)
	}
}

// TestIsCredentialHeader: the default deny rule, in any case.
func TestIsCredentialHeader(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Authorization", "proxy-authorization", "COOKIE", "X-Api-Key", "X-Goog-Api-Key", "X-Auth-Token",
		"X-Amz-Security-Token", "X-CSRF-Token", "X-XSRF-TOKEN", "X-Session-Id", "X-Hub-Signature-256", "X-Client-Secret", "X-Password"} {
		require.True(t, onceonly.IsCredentialHeader(name), name)
	}
	for _, name := range []string{onceonly.HeaderKey, "Content-Type", "X-Request-Id", "X-Region", "Accept", "User-Agent", "Traceparent"} {
		require.False(t, onceonly.IsCredentialHeader(name), name)
	}
}
