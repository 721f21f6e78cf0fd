package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestMakeStopStopsTheRun: `make stop` (scripts/run.sh stop) stops a `make
// run` going, as Ctrl-C does, and after a run killed outright it ends the
// daemons that run left. The run uses the test's Postgres, Redis and a
// nats-server of the test's own, so it starts no server.
func TestMakeStopStopsTheRun(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	nats := oncetest.NewNATSServer(t)
	dbURL := oncetest.DatabaseURL(t)

	// run starts scripts/run.sh and returns it, its state directory and
	// the api's address once the api is ready.
	run := func(t *testing.T) (*exec.Cmd, string, string) {
		state := filepath.Join(t.TempDir(), "run")
		api := oncetest.FreeAddr(t)
		cmd := exec.CommandContext(t.Context(), filepath.Join(root, "scripts", "run.sh"))
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
			"REDIS_PREFIX=run"+oncetest.RandomSuffix(6)+":", "BROKER_URL="+nats.URL(), "RUN_STATE="+state,
			"HTTP_ADDR="+api, "RELAY_HTTP_ADDR="+oncetest.FreeAddr(t), "RECONCILER_HTTP_ADDR="+oncetest.FreeAddr(t),
			"GATEWAY_HTTP_ADDR="+oncetest.FreeAddr(t), "CONSUMER_HTTP_ADDR="+oncetest.FreeAddr(t), "LOG_LEVEL=error")
		// A file, not a pipe: the daemons a killed run leaves hold it open,
		// and Wait would wait for them.
		out, err := os.Create(filepath.Join(t.TempDir(), "run.log"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = out.Close() })
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				log, _ := os.ReadFile(out.Name())
				t.Logf("run.sh output:\n%s", log)
			}
		})
		// The first run builds the commands.
		oncetest.Eventually(t, 5*time.Minute, "the api ready", func() bool { return oncetest.Ready(t.Context(), api) })
		return cmd, state, api
	}
	daemons := func(t *testing.T, state string) []int {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join(state, "daemons"))
		require.NoError(t, err)
		var pids []int
		for line := range strings.FieldsSeq(string(raw)) {
			pid, err := strconv.Atoi(line)
			require.NoError(t, err)
			pids = append(pids, pid)
		}
		require.Len(t, pids, 5, "gateway, api, relay, reconciler, consumer")
		t.Cleanup(func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		return pids
	}
	stop := func(t *testing.T, state string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), filepath.Join(root, "scripts", "run.sh"), "stop")
		cmd.Env = append(os.Environ(), "RUN_STATE="+state)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	gone := func(t *testing.T, pids []int) {
		t.Helper()
		for _, pid := range pids {
			// Reaped by the run, or orphans reaped by init: kill 0 fails.
			oncetest.Eventually(t, 15*time.Second, "daemon "+strconv.Itoa(pid)+" gone", func() bool {
				return syscall.Kill(pid, 0) != nil
			})
		}
	}

	t.Run("going", func(t *testing.T) {
		cmd, state, api := run(t)
		pids := daemons(t, state)
		require.Contains(t, stop(t, state), "run: stopped")
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Logf("run.sh ended: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("run.sh still going 30s after make stop")
		}
		gone(t, pids)
		require.NoDirExists(t, state)
		require.False(t, oncetest.Ready(t.Context(), api))
		require.Contains(t, stop(t, state), "nothing to stop")
	})

	t.Run("killed outright", func(t *testing.T) {
		cmd, state, _ := run(t)
		pids := daemons(t, state)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		for _, pid := range pids {
			require.NoError(t, syscall.Kill(pid, 0), "the daemons outlive a run killed outright")
		}
		require.Contains(t, stop(t, state), "run: stopped what a run left")
		gone(t, pids)
		require.NoDirExists(t, state)
	})
}
