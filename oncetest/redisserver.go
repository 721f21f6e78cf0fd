package oncetest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server process for tests that stop, restart
// or flush Redis and so cannot share the common one.
type RedisServer struct {
	tb    testing.TB
	port  int
	dir   string
	extra []string // more redis-server arguments (cluster mode)
	cmd   *exec.Cmd
}

// NewRedisServer starts a redis-server of the test's own on a free loopback
// port, without persistence; it is stopped when the test ends.
func NewRedisServer(tb testing.TB) *RedisServer {
	tb.Helper()
	return newRedisServer(tb, freePort(tb))
}

func newRedisServer(tb testing.TB, port int, extra ...string) *RedisServer {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("this test needs the redis-server binary: %v\n%s", err, howToStart)
	}
	s := &RedisServer{tb: tb, port: port, dir: tb.TempDir(), extra: extra}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// URL returns the server's redis:// URL.
func (s *RedisServer) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

// Addr returns host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server (again) and waits until it answers PING.
func (s *RedisServer) Start() {
	s.tb.Helper()
	if s.cmd != nil {
		return
	}
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, s.extra...)
	// Stop ends the server; the test's context is a backstop if it is not
	// reached.
	s.cmd = exec.CommandContext(s.tb.Context(), "redis-server", args...)
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(s.tb.Context()).Err() != nil {
		if time.Now().After(deadline) {
			s.tb.Fatalf("redis-server on port %d did not answer", s.port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server (its data is lost, as after a crash without
// persistence).
func (s *RedisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Port returns the server's port.
func (s *RedisServer) Port() int { return s.port }

// freePort returns a loopback TCP port that was free a moment ago, for a
// server a test starts. It takes it above the kernel's ephemeral range
// where there is room (as scripts/test.sh does): a port from that range,
// freed here, may become the source port of any outgoing connection before
// the server binds it (a redis-server that then never answers; seen once).
// Ports are handed out in turn from a random start, so two calls of one
// process never meet and two processes seldom do.
func freePort(tb testing.TB) int {
	tb.Helper()
	if portsAboveEphemeral() {
		for range testPorts {
			port := testPortsFrom + int(nextPort.Add(1)%testPorts)
			if portFree(tb, port) {
				return port
			}
		}
	}
	var lc net.ListenConfig
	l, err := lc.Listen(tb.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		tb.Fatalf("find a free port: %v is not a TCP address", l.Addr())
	}
	return addr.Port
}

// The ports freePort hands out when the ephemeral range ends below them:
// testPorts from testPortsFrom, clear of the fixed ports of scripts/test.sh
// and scripts/services.sh (61390-61779).
const (
	testPortsFrom = 62000
	testPorts     = 3000
)

// nextPort counts the ports freePort tried, from a random start.
var nextPort = func() *atomic.Uint64 {
	var n atomic.Uint64
	n.Store(rand.Uint64N(testPorts))
	return &n
}()

// portsAboveEphemeral reports whether the kernel's ephemeral range ends
// below testPortsFrom.
func portsAboveEphemeral() bool {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(raw))
	if len(fields) != 2 {
		return false
	}
	top, err := strconv.Atoi(fields[1])
	return err == nil && top < testPortsFrom
}

// portFree reports whether port can be listened on now.
func portFree(tb testing.TB, port int) bool {
	var lc net.ListenConfig
	l, err := lc.Listen(tb.Context(), "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// Restart stops and starts the server: an empty cache on the same address.
func (s *RedisServer) Restart() {
	s.Stop()
	s.Start()
}

// Client opens a client of this server alone that is closed when the test
// ends.
func (s *RedisServer) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
