package onceonly_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/internal/testenv"
)

// TestHandOffLandsOncePostgresIsBack: an execution whose step's outcome is
// unknown, and whose hand-off Postgres refused (it was what failed), hands
// its key off as soon as Postgres answers again — long before its lease
// would have ended — so the client's next retry takes the key over at once.
func TestHandOffLandsOncePostgresIsBack(t *testing.T) {
	t.Parallel()
	dbURL := testenv.DatabaseURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	db := strings.TrimPrefix(u.Path, "/")
	admin := testenv.Pool(t, testenv.AdminDatabaseURL(t))
	ctx := testenv.Context(t)
	setConnections := func(allow bool) {
		_, err := admin.Exec(context.WithoutCancel(ctx), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS `+map[bool]string{true: "true", false: "false"}[allow])
		require.NoError(t, err)
		if !allow {
			_, err = admin.Exec(context.WithoutCancel(ctx), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
			require.NoError(t, err)
		}
	}
	t.Cleanup(func() { setConnections(true) })

	const lease = 30 * time.Second
	engine, err := onceonly.New(onceonly.Config{Pool: testenv.Pool(t, dbURL), LeaseTimeout: lease, Logger: testenv.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	cut := true
	require.NoError(t, engine.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		_, err := onceonly.Step(ctx, "call", func(context.Context, string) (string, error) {
			if cut {
				// Postgres goes away while the call is out: its answer is
				// lost, and the hand-off cannot land either.
				setConnections(false)
				return "", errors.New("connection reset")
			}
			return "ch_1", nil
		})
		if err != nil {
			return onceonly.Result{Status: http.StatusBadGateway}, nil //nolint:nilerr // the step's outcome is unknown: answered, not raised
		}
		return onceonly.Result{Status: http.StatusCreated, Body: []byte(`{"charge":"ch_1"}`)}, nil
	}))

	out, err := engine.Run(ctx, "charge", "acct_1", "k1", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, out.Status)
	setConnections(true)
	cut = false

	check := testenv.Pool(t, dbURL)
	testenv.Eventually(t, 5*time.Second, "the key handed off once Postgres answered", func() bool {
		var handedOff bool
		err := check.QueryRow(ctx, `SELECT lease_expires_at <= now() FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'k1'`).Scan(&handedOff)
		return err == nil && handedOff
	})
	out, err = engine.Run(ctx, "charge", "acct_1", "k1", []byte(`{}`))
	require.NoError(t, err, "the retry takes the key over at once")
	require.Equal(t, http.StatusCreated, out.Status)
}
