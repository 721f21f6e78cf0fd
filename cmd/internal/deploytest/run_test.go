package deploytest

import (
	"context"
	"io"
	"net/http"
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
	run := func(t *testing.T) (*exec.Cmd, <-chan struct{}, string, string) {
		state := filepath.Join(t.TempDir(), "run")
		api := oncetest.FreeAddr(t)
		cmd, exited := startRun(t, root, "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
			"REDIS_PREFIX=run"+oncetest.RandomSuffix(6)+":", "BROKER_URL="+nats.URL(), "RUN_STATE="+state,
			"HTTP_ADDR="+api, "RELAY_HTTP_ADDR="+oncetest.FreeAddr(t), "RECONCILER_HTTP_ADDR="+oncetest.FreeAddr(t),
			"GATEWAY_HTTP_ADDR="+oncetest.FreeAddr(t), "CONSUMER_HTTP_ADDR="+oncetest.FreeAddr(t), "LOG_LEVEL=error")
		// The first run builds the commands.
		oncetest.Eventually(t, 5*time.Minute, "the api ready", func() bool { return oncetest.Ready(t.Context(), api) })
		return cmd, exited, state, api
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
		_, exited, state, api := run(t)
		pids := daemons(t, state)
		require.Contains(t, stop(t, state), "run: stopped")
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Fatal("run.sh still going 30s after make stop")
		}
		gone(t, pids)
		require.NoDirExists(t, state)
		require.False(t, oncetest.Ready(t.Context(), api))
		require.Contains(t, stop(t, state), "nothing to stop")
	})

	t.Run("killed outright", func(t *testing.T) {
		cmd, exited, state, _ := run(t)
		pids := daemons(t, state)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
		for _, pid := range pids {
			require.NoError(t, syscall.Kill(pid, 0), "the daemons outlive a run killed outright")
		}
		require.Contains(t, stop(t, state), "run: stopped what a run left")
		gone(t, pids)
		require.NoDirExists(t, state)
	})
}

// TestMakeRunStandInBrokers: `make run BROKER=kafka` and `BROKER=sqs`
// start their stand-in broker (kfake; goaws behind its JSON front) under
// the run's data directory and the consumer on it; a payment message
// published there is paid once and acked; `make stop` stops the broker
// too. The run uses the test's Postgres and Redis.
func TestMakeRunStandInBrokers(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	for _, b := range []struct{ broker, portVar, scheme, dir, pidFile string }{
		{"kafka", "KAFKA_PORT", "kafka", "kafka", "kfakeserver.pid"},
		{"sqs", "SQS_PORT", "sqs", "sqs", "goawsd.pid"},
	} {
		t.Run(b.broker, func(t *testing.T) {
			data := t.TempDir()
			state := filepath.Join(data, "run")
			dbURL := oncetest.DatabaseURL(t)
			brokerAddr := oncetest.FreeAddr(t)
			brokerURL := b.scheme + "://" + brokerAddr
			api, consumer := oncetest.FreeAddr(t), oncetest.FreeAddr(t)
			stop := func() string {
				cmd := exec.CommandContext(context.WithoutCancel(t.Context()), filepath.Join(root, "scripts", "run.sh"), "stop")
				cmd.Env = append(os.Environ(), "RUN_STATE="+state)
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
				return string(out)
			}
			// Last: whatever a failed test left (a run killed outright, its
			// daemons and its broker).
			t.Cleanup(func() { _ = stop() })
			startRun(t, root, "BROKER="+b.broker, b.portVar+"="+strings.TrimPrefix(brokerAddr, "127.0.0.1:"),
				"RUN_DATA="+data, "BROKER_URL=", "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
				"REDIS_PREFIX=run"+oncetest.RandomSuffix(6)+":", "HTTP_ADDR="+api, "RELAY_HTTP_ADDR="+oncetest.FreeAddr(t),
				"RECONCILER_HTTP_ADDR="+oncetest.FreeAddr(t), "GATEWAY_HTTP_ADDR="+oncetest.FreeAddr(t),
				"CONSUMER_HTTP_ADDR="+consumer, "LOG_LEVEL=error")
			began := time.Now()
			oncetest.Eventually(t, 5*time.Minute, "the consumer ready", func() bool { return oncetest.Ready(t.Context(), consumer) })
			t.Logf("the consumer ready on %s after %s", b.broker, time.Since(began).Round(time.Millisecond))
			pidFile := filepath.Join(data, b.dir, b.pidFile)
			require.FileExists(t, pidFile, "the stand-in broker runs under the run's data directory")
			raw, err := os.ReadFile(pidFile)
			require.NoError(t, err)
			brokerPid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			require.NoError(t, err)

			key := "run-" + b.broker + "-" + oncetest.RandomSuffix(6)
			publish := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "consumer"), "publish", key,
				`{"merchant":"acct_demo","amount":2500,"currency":"usd","customer":"cus_run","source":"tok_visa"}`)
			publish.Env = append(os.Environ(), "BROKER_URL="+brokerURL)
			pubOut, err := publish.CombinedOutput()
			require.NoError(t, err, "%s", pubOut)

			pool := oncetest.Pool(t, dbURL)
			oncetest.Eventually(t, 30*time.Second, "the message paid and acked", func() bool {
				var rows int
				if pool.QueryRow(t.Context(), `SELECT count(*) FROM payments WHERE merchant_id = 'acct_demo' AND idempotency_key = $1`,
					key).Scan(&rows) != nil || rows != 1 {
					return false
				}
				return consumerAcked(t, consumer) == 1
			})
			t.Logf("published, paid and acked after %s", time.Since(began).Round(time.Millisecond))

			require.Contains(t, stop(), "run: stopped")
			oncetest.Eventually(t, 15*time.Second, "the stand-in broker gone", func() bool { return syscall.Kill(brokerPid, 0) != nil })
			require.NoFileExists(t, pidFile)
			require.NoDirExists(t, state)
			t.Logf("stopped after %s", time.Since(began).Round(time.Millisecond))
		})
	}
}

// startRun starts scripts/run.sh with env added to the test's, and reaps
// it as soon as it ends: exited is closed then. (A run not reaped stays a
// zombie, which `make stop` takes for a run going and waits 30 s on.)
// Its output goes to a file, logged when the test fails.
func startRun(t *testing.T, root string, env ...string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "scripts", "run.sh"))
	cmd.Env = append(os.Environ(), env...)
	// A file, not a pipe: the daemons a killed run leaves hold it open,
	// and Wait would wait for them.
	out, err := os.Create(filepath.Join(t.TempDir(), "run.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = out.Close() })
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		t.Logf("run.sh ended: %v", err)
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			log, _ := os.ReadFile(out.Name())
			t.Logf("run.sh output:\n%s", log)
		}
	})
	return cmd, exited
}

// consumerAcked returns how many messages the consumer at addr acked as
// executed, from its /metrics (0 when it does not answer).
func consumerAcked(t *testing.T, addr string) int {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/metrics", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.SplitSeq(string(raw), "\n") {
		if (strings.HasPrefix(line, "onceonly_kafka_records_total{") || strings.HasPrefix(line, "onceonly_sqs_messages_total{")) &&
			strings.Contains(line, `disposition="ack"`) && strings.Contains(line, `reason="executed"`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += int(v)
		}
	}
	return n
}
