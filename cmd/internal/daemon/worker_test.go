package daemon_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

// workerSetup is a Setup on the test servers.
func workerSetup(t *testing.T, dbURL string) daemon.Setup {
	t.Helper()
	pg, err := postgres.Parse(dbURL)
	require.NoError(t, err)
	rdb, err := cache.ClientOptions(oncetest.RedisURL(t), "")
	require.NoError(t, err)
	return daemon.Setup{Log: oncetest.QuietLogger(), Postgres: pg, Redis: rdb}
}

func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/readyz", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

// TestWorkerRun: the worker's ops server answers beside its work, checking
// Postgres and Redis, and both stop when the context ends.
func TestWorkerRun(t *testing.T) {
	w, err := daemon.OpenWorker(t.Context(), workerSetup(t, oncetest.DatabaseURL(t)))
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, w.Pool.Ping(t.Context()))
	require.NoError(t, w.Redis.Ping(t.Context()).Err())

	addr := oncetest.FreeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	working := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, addr, func(ctx context.Context) error {
			close(working)
			<-ctx.Done()
			return nil
		})
	}()
	<-working
	oncetest.WaitReady(t, addr)
	code, body := readyz(t, addr)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"ready","checks":{"postgres":"ok","redis":"ok"}}`, body)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop within 10s")
	}
}

// TestOpenWorkerRefuses: no Redis, or a schema behind, and the worker does
// not open.
func TestOpenWorkerRefuses(t *testing.T) {
	s := workerSetup(t, oncetest.DatabaseURL(t))
	s.Redis = nil
	_, err := daemon.OpenWorker(t.Context(), s)
	require.ErrorIs(t, err, cache.ErrNoRedisURL)

	_, err = daemon.OpenWorker(t.Context(), workerSetup(t, oncetest.EmptyDatabaseURL(t)))
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
}
