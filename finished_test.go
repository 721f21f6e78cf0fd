package onceonly_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// executions returns onceonly_executions_total{by, outcome}.
func executions(t *testing.T, reg *prometheus.Registry, by, outcome string) float64 {
	t.Helper()
	return oncetest.Metric(t, reg, "onceonly_executions_total", map[string]string{"by": by, "outcome": outcome})
}

// logLine returns the line of logs that says msg about key.
func logLine(logs, msg, key string) string {
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, "msg=\""+msg+"\"") && strings.Contains(line, "key="+key+" ") {
			return line
		}
	}
	return ""
}

// TestExecutionsSayWhoFinished: the executions metric and the line that
// logs an execution's end say who ran it: the first request, a retry that
// took over a lease that ran out, or the resumer.
func TestExecutionsSayWhoFinished(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	logs := &oncetest.LogBuffer{}
	reg := prometheus.NewRegistry()
	e, err := onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, LeaseTimeout: 2 * time.Second, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)

	// A first execution.
	_, err = e.Do(b.ctx, "m", "first", []byte("p"), payment(201, "{}"))
	require.NoError(t, err)
	require.Equal(t, 1.0, executions(t, reg, "first", "executed"))
	require.Contains(t, logLine(logs.String(), "execution finished", "first"), "level=DEBUG")
	require.Contains(t, logLine(logs.String(), "execution finished", "first"), "by=first outcome=executed")

	// A retry that takes over the lease of a holder that died.
	ref := keystate.Ref{Scope: "m", Key: "taken"}
	claim, err := outbox.New(outbox.Config{}).Claim(b.ctx, b.pool, ref, onceonly.PayloadFingerprint([]byte("p")), keystate.NewOwner(), 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, claim.Claimed)
	oncetest.AwaitLeaseOver(t, b.ctx, b.pool, ref, 0)
	out, err := e.Do(b.ctx, "m", "taken", []byte("p"), payment(201, "{}"))
	require.NoError(t, err)
	require.False(t, out.Replayed)
	require.Equal(t, 1.0, executions(t, reg, "takeover", "executed"))
	require.Contains(t, logLine(logs.String(), "execution finished", "taken"), "level=INFO")
	require.Contains(t, logLine(logs.String(), "execution finished", "taken"), "by=takeover outcome=executed")

	// An execution handed off after a step, which the resumer finishes.
	var runs atomic.Int32
	require.NoError(t, e.Register("charge", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		first := runs.Add(1) == 1
		_, err := onceonly.Step(ctx, "charge", func(context.Context, string) (string, error) {
			if first {
				return "", errors.New("connection reset")
			}
			return "ch_1", nil
		})
		if err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: http.StatusCreated}, nil
	}))
	_, err = e.Run(b.ctx, "charge", "m", "resumed", []byte(`{}`))
	require.True(t, requireExecutionError(t, err).HandedOff)
	require.Equal(t, 1.0, executions(t, reg, "first", "handler_error"))
	n, err := e.ResumeOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1.0, executions(t, reg, "resumer", "executed"))
	require.Contains(t, logLine(logs.String(), "execution resumed", "resumed"), "level=INFO")
	require.Contains(t, logLine(logs.String(), "execution resumed", "resumed"), "by=resumer outcome=executed")
}
