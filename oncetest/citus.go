package oncetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// HowToStartCitus says how to get the Citus cluster TEST_CITUS_URL names.
const HowToStartCitus = `these tests need a Citus 13.2 cluster (PostgreSQL 15, a coordinator and workers):
  CITUS_SRC=/path/to/citus-v13.2.2 scripts/citus.sh build   # once, as root (docs/citus.md)
  scripts/citus.sh start .data/citus 61810
  TEST_CITUS_URL='postgres://postgres@127.0.0.1:61810/postgres?sslmode=disable' make test-citus`

// defaultAdminDB is the database of TEST_CITUS_URL when it names none.
const defaultAdminDB = "postgres"

// citusNode is one server of a Citus cluster, as pg_dist_node names it.
type citusNode struct {
	host string
	port int
}

// url returns admin (the coordinator's URL, with its user and options)
// pointed at database db on n.
func (n citusNode) url(admin *neturl.URL, db string) string {
	u := *admin
	u.Host = net.JoinHostPort(n.host, strconv.Itoa(n.port))
	u.Path = "/" + db
	return u.String()
}

// exec runs sql with args in database db of n.
func (n citusNode) exec(ctx context.Context, admin *neturl.URL, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, n.url(admin, db))
	if err != nil {
		return fmt.Errorf("connect to %s:%d/%s: %w", n.host, n.port, db, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s:%d/%s: %s: %w", n.host, n.port, db, sql, err)
	}
	return nil
}

// citusNodes returns the coordinator admin names, then the cluster's
// active primary workers.
func citusNodes(ctx context.Context, admin *neturl.URL) ([]citusNode, error) {
	conn, err := pgx.Connect(ctx, admin.String())
	if err != nil {
		return nil, fmt.Errorf("connect to the coordinator (%s): %w\n%s", admin.Redacted(), err, HowToStartCitus)
	}
	defer conn.Close(ctx)
	coordinator := citusNode{host: admin.Hostname(), port: 5432}
	if p := admin.Port(); p != "" {
		coordinator.port, _ = strconv.Atoi(p)
	}
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE groupid <> 0 AND noderole = 'primary' AND isactive ORDER BY nodeid`)
	if err != nil {
		return nil, fmt.Errorf("list the workers (is citus in %s?): %w\n%s", admin.Redacted(), err, HowToStartCitus)
	}
	workers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (citusNode, error) {
		var n citusNode
		if err := row.Scan(&n.host, &n.port); err != nil {
			return n, fmt.Errorf("read a worker: %w", err)
		}
		return n, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the workers: %w", err)
	}
	if len(workers) == 0 {
		return nil, errors.New("the coordinator has no workers (citus_add_node)\n" + HowToStartCitus)
	}
	return append([]citusNode{coordinator}, workers...), nil
}

// CitusDatabaseURL creates an empty database of the test's own on every
// node of the Citus cluster whose coordinator TEST_CITUS_URL names, with
// the citus extension, the coordinator's host set and the workers added
// in it (Citus registers nodes per database; a template database would
// hold no shards), and returns its URL on the coordinator. It is dropped
// on every node when the test ends. Without TEST_CITUS_URL the test fails
// and says how to start a cluster.
func CitusDatabaseURL(tb testing.TB) string {
	tb.Helper()
	ctx := Context(tb)
	admin, err := neturl.Parse(Env(tb, "TEST_CITUS_URL", "no Citus cluster", HowToStartCitus))
	if err != nil {
		tb.Fatalf("TEST_CITUS_URL: %v", err)
	}
	adminDB := strings.TrimPrefix(admin.Path, "/")
	if adminDB == "" {
		adminDB = defaultAdminDB
	}
	nodes, err := citusNodes(ctx, admin)
	if err != nil {
		tb.Fatal(err)
	}
	name := "onceonly_citus_" + RandomSuffix(12)
	tb.Cleanup(func() {
		for _, n := range nodes {
			if err := n.exec(context.Background(), admin, adminDB, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				tb.Logf("drop the test database: %v", err)
			}
		}
	})
	for _, n := range nodes {
		if err := n.exec(ctx, admin, adminDB, "CREATE DATABASE "+name); err != nil {
			tb.Fatal(err)
		}
		if err := n.exec(ctx, admin, name, "CREATE EXTENSION citus"); err != nil {
			tb.Fatal(err)
		}
	}
	coordinator := nodes[0]
	if err := coordinator.exec(ctx, admin, name, "SELECT citus_set_coordinator_host($1, $2)", coordinator.host, coordinator.port); err != nil {
		tb.Fatal(err)
	}
	for _, w := range nodes[1:] {
		if err := coordinator.exec(ctx, admin, name, "SELECT citus_add_node($1, $2)", w.host, w.port); err != nil {
			tb.Fatal(err)
		}
	}
	return coordinator.url(admin, name)
}

// MigratedCitusURL returns the URL of a database of the test's own on the Citus
// cluster (CitusDatabaseURL), migrated as `api migrate up` does: the
// engine's tables distributed.
func MigratedCitusURL(tb testing.TB) string {
	tb.Helper()
	url := CitusDatabaseURL(tb)
	pool := Pool(tb, url)
	if err := MigrateUp(Context(tb), pool); err != nil {
		tb.Fatalf("migrate the Citus database: %v", err)
	}
	pool.Close()
	return url
}
