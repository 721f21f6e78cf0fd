package oncetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// PostgresServer is a private Postgres cluster for tests that restart
// Postgres and so cannot share the common one. It runs without fsync.
type PostgresServer struct {
	tb   testing.TB
	bin  string
	dir  string
	port int
}

// NewPostgresServer runs initdb in a temporary folder and starts the
// server on a free loopback port; it is stopped and removed when the test
// ends. As root, the server runs as the postgres user.
func NewPostgresServer(tb testing.TB) *PostgresServer {
	tb.Helper()
	bin, err := postgresBin()
	if err != nil {
		tb.Fatalf("%v\n%s", err, howToStart)
	}
	dir, err := os.MkdirTemp("", "onceonly-pg-") //nolint:usetesting // as root the server runs as postgres, which cannot enter tb.TempDir's root-only parent
	if err != nil {
		tb.Fatalf("make a data folder: %v", err)
	}
	s := &PostgresServer{tb: tb, bin: bin, dir: dir, port: freePort(tb)}
	tb.Cleanup(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("running as root needs a postgres user for Postgres: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatalf("chown the data folder: %v", err)
		}
	}
	s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
	s.Start()
	return s
}

func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append([]string{"/usr/lib/postgresql/15/bin"}, dirs...) {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no Postgres binaries (initdb) found")
}

func (s *PostgresServer) data() string { return filepath.Join(s.dir, "data") }

// run runs a Postgres binary, as the postgres user when root.
func (s *PostgresServer) run(name string, args ...string) {
	s.tb.Helper()
	argv := append([]string{filepath.Join(s.bin, name)}, args...)
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	out, err := exec.CommandContext(s.tb.Context(), argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		s.tb.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// URL returns the postgres:// URL of the server's postgres database.
func (s *PostgresServer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Start starts the server and waits until it accepts connections.
func (s *PostgresServer) Start() {
	s.tb.Helper()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s "+
		"-c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off", s.port, s.dir)
	s.run("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "server.log"), "-o", opts, "-w", "-t", "60", "start")
}

// Stop stops the server at once (fast shutdown: sessions are cut, as in a
// failover).
func (s *PostgresServer) Stop() {
	argv := []string{filepath.Join(s.bin, "pg_ctl"), "-D", s.data(), "-m", "fast", "-w", "stop"}
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	// Background, not the test's context: Stop runs from Cleanup, after that
	// context has ended.
	_ = exec.CommandContext(context.Background(), argv[0], argv[1:]...).Run()
}

// Restart stops and starts the server; data survives.
func (s *PostgresServer) Restart() {
	s.tb.Helper()
	s.Stop()
	s.Start()
}
