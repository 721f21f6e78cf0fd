// Package citus runs onceonly on Citus (distributed PostgreSQL, DESIGN §5):
// the commands as real processes with DATABASE_URL at the coordinator of
// the cluster TEST_CITUS_URL names. It checks that `api migrate up`
// distributes the tables, that the tour passes, that a short chaos run
// (api processes killed, Redis flushed, every payment sent several times)
// makes no duplicate payment and the outbox drains, and that `relay --once`
// and `reconciler --once` find everything in sync.
//
// Only `make test-citus` runs these tests (scripts/test-citus.sh; `make
// test` leaves this module out: CI has no Citus). Without TEST_CITUS_URL
// they fail and say how to build and start a cluster. Each test gets a
// database of its own on every node of the cluster, with the workers
// registered in it (Citus registers nodes per database).
package citus

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/testenv"
)

const howToStartCitus = `these tests need a Citus 13.2 cluster (PostgreSQL 15, a coordinator and workers):
  CITUS_SRC=/path/to/citus-v13.2.2 scripts/citus.sh build   # once, as root (docs/citus.md)
  scripts/citus.sh start .data/citus 61810
  TEST_CITUS_URL='postgres://postgres@127.0.0.1:61810/postgres?sslmode=disable' make test-citus`

func TestMain(m *testing.M) {
	if os.Getenv("TEST_CITUS_URL") == "" {
		fmt.Fprintf(os.Stderr, "TEST_CITUS_URL is not set: %s\n", howToStartCitus)
		os.Exit(1)
	}
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// node is one server of the cluster, as pg_dist_node names it.
type node struct {
	host        string
	port        int
	coordinator bool
}

// url returns u (the coordinator's URL, with its user, password and
// options) pointed at database db on n.
func (n node) url(u *neturl.URL, db string) string {
	v := *u
	v.Host = net.JoinHostPort(n.host, strconv.Itoa(n.port))
	v.Path = "/" + db
	return v.String()
}

// clusterNodes returns the coordinator and the active primary workers of
// the cluster whose coordinator admin names.
func clusterNodes(ctx context.Context, admin *neturl.URL) ([]node, error) {
	conn, err := pgx.Connect(ctx, admin.String())
	if err != nil {
		return nil, fmt.Errorf("connect to the coordinator (%s): %w\n%s", admin.Redacted(), err, howToStartCitus)
	}
	defer conn.Close(ctx)
	nodes := []node{{host: admin.Hostname(), port: 5432, coordinator: true}}
	if p := admin.Port(); p != "" {
		nodes[0].port, _ = strconv.Atoi(p)
	}
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE groupid <> 0 AND noderole = 'primary' AND isactive ORDER BY nodeid`)
	if err != nil {
		return nil, fmt.Errorf("list the workers (is the citus extension in %s?): %w\n%s", admin.Redacted(), err, howToStartCitus)
	}
	workers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (node, error) {
		var n node
		err := row.Scan(&n.host, &n.port)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the workers: %w", err)
	}
	if len(workers) == 0 {
		return nil, errors.New("the coordinator has no workers (citus_add_node)\n" + howToStartCitus)
	}
	return append(nodes, workers...), nil
}

// exec runs sql with args on database db of n.
func (n node) exec(ctx context.Context, u *neturl.URL, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, n.url(u, db))
	if err != nil {
		return fmt.Errorf("connect to %s:%d/%s: %w", n.host, n.port, db, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s:%d/%s: %s: %w", n.host, n.port, db, sql, err)
	}
	return nil
}

// citusDatabase creates an empty database of the test's own on every node
// of the cluster at TEST_CITUS_URL, with the citus extension, the
// coordinator's host set and the workers added in it (as
// `scripts/citus.sh createdb` does), and returns its URL on the
// coordinator. It is dropped on every node when the test ends.
func citusDatabase(t *testing.T) string {
	t.Helper()
	ctx := testenv.Context(t)
	admin, err := neturl.Parse(testenv.Env(t, "TEST_CITUS_URL", "no Citus cluster", howToStartCitus))
	if err != nil {
		t.Fatalf("TEST_CITUS_URL: %v", err)
	}
	adminDB := strings.TrimPrefix(admin.Path, "/")
	if adminDB == "" {
		adminDB = "postgres"
	}
	nodes, err := clusterNodes(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	name := "onceonly_citus_" + testenv.RandomSuffix(12)
	t.Cleanup(func() {
		for _, n := range nodes {
			if err := n.exec(context.Background(), admin, adminDB, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				t.Logf("drop the test database: %v", err)
			}
		}
	})
	for _, n := range nodes {
		if err := n.exec(ctx, admin, adminDB, "CREATE DATABASE "+name); err != nil {
			t.Fatal(err)
		}
		if err := n.exec(ctx, admin, name, "CREATE EXTENSION citus"); err != nil {
			t.Fatal(err)
		}
	}
	coord := nodes[0]
	if err := coord.exec(ctx, admin, name, "SELECT citus_set_coordinator_host($1, $2)", coord.host, coord.port); err != nil {
		t.Fatal(err)
	}
	for _, w := range nodes[1:] {
		if err := coord.exec(ctx, admin, name, "SELECT citus_add_node($1, $2)", w.host, w.port); err != nil {
			t.Fatal(err)
		}
	}
	return coord.url(admin, name)
}

var (
	buildOnce sync.Once
	binDir    string
	errBuild  error
)

// commands builds api, relay, reconciler, gateway, consumer and the tour
// (without -race: several of them share the machine with three Postgres
// servers) once per test binary and returns their folder.
func commands(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, errBuild = os.MkdirTemp("", "onceonly-citus-bin-")
		if errBuild != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "../cmd/api", "../cmd/relay", "../cmd/reconciler",
			"../cmd/gateway", "../cmd/consumer", "../examples/tour").CombinedOutput()
		if err != nil {
			errBuild = fmt.Errorf("build the commands: %w\n%s", err, out)
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return binDir
}

// migrateUp runs `api migrate up` on dbURL, as a user does.
func migrateUp(t *testing.T, bins, dbURL string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bins+"/api", "migrate", "up")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("api migrate up on Citus: %v\n%s", err, out)
	}
}
