package oncetest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const howToStartNATS = `start nats-server with JetStream: scripts/test.sh does it (TEST_NATS_PORT, default 61442),
or scripts/services.sh nats .data/dev 4222 and export TEST_NATS_URL=nats://127.0.0.1:4222`

// NATSURL returns TEST_NATS_URL, the nats:// URL of a nats-server with
// JetStream on, and fails the test when it is not set. Tests share the
// server: each declares streams, subjects and consumers of its own
// (RandomSuffix in their names).
func NATSURL(tb testing.TB) string {
	tb.Helper()
	return Env(tb, "TEST_NATS_URL", "no NATS server for tests", howToStartNATS)
}

// NATSServer is a private nats-server process with JetStream on, for tests
// that stop or restart the server and so cannot share the common one. Its
// streams are stored in a directory of the test's own and survive Restart.
type NATSServer struct {
	tb   testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

// NewNATSServer starts a nats-server of the test's own on a free loopback
// port; it is stopped when the test ends.
func NewNATSServer(tb testing.TB) *NATSServer {
	tb.Helper()
	if _, err := exec.LookPath("nats-server"); err != nil {
		tb.Fatalf("this test needs the nats-server binary: %v\n%s", err, howToStartNATS)
	}
	s := &NATSServer{tb: tb, port: freePort(tb), dir: tb.TempDir()}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// URL returns the server's nats:// URL.
func (s *NATSServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server (again) and waits until it greets a client with
// JetStream on.
func (s *NATSServer) Start() {
	s.tb.Helper()
	if s.cmd != nil {
		return
	}
	// Stop ends the server; the test's context is a backstop if it is not
	// reached.
	s.cmd = exec.CommandContext(s.tb.Context(), "nats-server", "--jetstream",
		"--store_dir", s.dir, "--addr", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--log", filepath.Join(s.dir, "nats.log"))
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start nats-server: %v", err)
	}
	Eventually(s.tb, 10*time.Second, fmt.Sprintf("nats-server on port %d with JetStream", s.port), func() bool {
		return natsReady(s.tb.Context(), s.port)
	})
}

// Stop kills the server (SIGKILL, as a crash): what it stored stays on
// disk for the next Start.
func (s *NATSServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server and starts it again on the same port and store.
func (s *NATSServer) Restart() {
	s.tb.Helper()
	s.Stop()
	s.Start()
}

// natsReady reports whether the server on port greets with an INFO line
// that says JetStream is on: it accepts clients once JetStream is up.
func natsReady(ctx context.Context, port int) bool {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "INFO ") && strings.Contains(line, `"jetstream":true`)
}
