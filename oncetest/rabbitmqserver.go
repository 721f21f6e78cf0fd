package oncetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// RabbitMQServer is a private RabbitMQ node for tests that restart the
// broker and so cannot share the common one (TEST_AMQP_URL). It is started
// by scripts/services.sh rabbitmq, as the shared one is: its data, logs and
// Erlang cookie in a folder of the test's own, AMQP on a free loopback port
// and its Erlang ports the next seven. Its queues are on disk and survive
// Restart.
type RabbitMQServer struct {
	tb     testing.TB
	script string
	dir    string
	port   int
}

// rabbitMQStartTimeout bounds one start of the node: an Erlang VM boot,
// several seconds on a loaded machine.
const rabbitMQStartTimeout = 2 * time.Minute

// NewRabbitMQServer starts a RabbitMQ node of the test's own; it is
// stopped when the test ends. It needs rabbitmq-server (scripts/test.sh
// installs it).
func NewRabbitMQServer(tb testing.TB) *RabbitMQServer {
	tb.Helper()
	script, err := servicesScript()
	if err != nil {
		tb.Fatalf("%v\n%s", err, howToStartRabbitMQ)
	}
	s := &RabbitMQServer{tb: tb, script: script, dir: tb.TempDir(), port: freePortRun(tb, 8)}
	tb.Cleanup(s.Stop) // before the folder is removed (cleanups run last first)
	s.Start()
	return s
}

// URL returns the node's amqp:// URL (RabbitMQ's guest account, which it
// lets in from loopback).
func (s *RabbitMQServer) URL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", s.port)
}

// Start starts the node (again) and returns once it answers an AMQP
// handshake.
func (s *RabbitMQServer) Start() {
	s.tb.Helper()
	s.run("rabbitmq", s.dir, strconv.Itoa(s.port))
}

// Stop stops the node gracefully (its queues are on disk); a node that
// does not stop in 30 s is killed.
func (s *RabbitMQServer) Stop() { s.run("stop-brokers", s.dir) }

// Ctl runs rabbitmqctl against the node (the wrapper scripts/services.sh
// writes beside it) and returns its standard output; it fails the test
// when the command fails. Each run boots an Erlang VM: a second or more.
func (s *RabbitMQServer) Ctl(args ...string) string {
	s.tb.Helper()
	return runRabbitMQCtl(s.tb, filepath.Join(s.dir, "rabbitmq", "rabbitmqctl"), args...)
}

// Restart stops the node and starts it again on the same port and data.
func (s *RabbitMQServer) Restart() {
	s.tb.Helper()
	s.Stop()
	s.Start()
}

func (s *RabbitMQServer) run(args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), rabbitMQStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.script, args...)
	cmd.Dir = s.dir // an Erlang crash dump lands there, not in the package
	if out, err := cmd.CombinedOutput(); err != nil {
		s.tb.Errorf("%s %v: %v\n%s", s.script, args, err, out)
	}
}

// servicesScript finds scripts/services.sh above the working directory
// (a package's folder, when go test runs).
func servicesScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find scripts/services.sh: %w", err)
	}
	for {
		script := filepath.Join(dir, "scripts", "services.sh")
		if _, err := os.Stat(script); err == nil {
			return script, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no scripts/services.sh above %s", dir)
		}
		dir = parent
	}
}

// freePortRun returns the first of n consecutive loopback ports that were
// free a moment ago.
func freePortRun(tb testing.TB, n int) int {
	tb.Helper()
	for range 100 {
		first := freePort(tb)
		ok := true
		for p := first + 1; p < first+n && ok; p++ {
			ok = portFree(tb, p)
		}
		if ok {
			return first
		}
	}
	tb.Fatalf("no %d consecutive free ports", n)
	return 0
}
