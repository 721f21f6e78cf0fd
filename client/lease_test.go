package client_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/oncetest"
)

// guarded serves POST /pay through the middleware of an engine on pool,
// with the default lease; hold, when not nil, runs first in every
// execution.
func guarded(t *testing.T, pool *pgxpool.Pool, hold func()) *httptest.Server {
	t.Helper()
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	mw := engine.Middleware(onceonly.MiddlewareOptions{Scope: func(*http.Request) (string, error) { return "tenant", nil }})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold != nil {
			hold()
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_1"}`)
	})))
	t.Cleanup(srv.Close)
	return srv
}

// A key a live request holds past the client's MaxElapsed: Do returns the
// last 409 with a *NotFinalError, never a nil error.
func TestGivesUpWithAnError(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}, 1), make(chan struct{})
	srv := guarded(t, oncetest.DB(t), func() {
		started <- struct{}{}
		<-release
	})
	ctx := oncetest.Context(t)
	req := client.Request{Method: "POST", URL: srv.URL + "/pay", Key: "order-1", Body: []byte(`{"amount":1}`)}
	first := make(chan error, 1)
	go func() {
		_, err := (&client.Client{}).Do(ctx, req)
		first <- err
	}()
	defer func() {
		close(release)
		require.NoError(t, <-first)
	}()
	<-started // the first request holds the key
	res, err := (&client.Client{MinDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxElapsed: 1500 * time.Millisecond}).Do(ctx, req)
	notFinal, ok := errors.AsType[*client.NotFinalError](err)
	require.True(t, ok, "got %v", err)
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Same(t, res, notFinal.Response)
	require.Greater(t, res.Attempts, 1)
	require.ErrorContains(t, err, "no final answer")
}

// The zero Client outlasts the engine's default lease: a key whose holder
// died (its claim committed, then nothing) answers 409 for up to 30 s, and
// the client is still retrying when the lease frees it, so it gets the
// final answer.
func TestDefaultsOutlastTheDefaultLease(t *testing.T) {
	t.Parallel()
	require.Greater(t, client.DefaultMaxElapsed, onceonly.DefaultLeaseTimeout)
	pool := oncetest.DB(t)
	srv := guarded(t, pool, nil)
	ctx := oncetest.Context(t)
	body := []byte(`{"amount":1}`)
	fp, err := onceonly.RequestFingerprint(httptest.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(string(body))), body)
	require.NoError(t, err)
	// The holder that died: its claim, with the default lease, and nothing
	// after it.
	_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
		VALUES ('tenant', 'order-1', 'in_progress', 1, $1, gen_random_uuid(), now() + $2::interval, now() + interval '1 hour')`,
		fp, onceonly.DefaultLeaseTimeout.String())
	require.NoError(t, err)

	began := time.Now()
	res, err := (&client.Client{}).Do(ctx, client.Request{Method: "POST", URL: srv.URL + "/pay", Key: "order-1", Body: body})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Greater(t, res.Attempts, 1, "it met the 409 first")
	require.Greater(t, time.Since(began), onceonly.DefaultLeaseTimeout-2*time.Second, "the lease held the key")
}
