// Package oncetest gives tests real Postgres and Redis servers: the ones named
// by TEST_DATABASE_URL and TEST_REDIS_URL, else a failure that says how to
// start them: `make test` starts local servers, and where a Docker engine
// answers, tools/testservers starts containers through testcontainers-go
// and runs the tests against them. Tests are never skipped for want of a
// server. (The containers live in a module of their own so that
// testcontainers-go is no requirement of the library's module.)
//
// Each test gets its own database, copied from a migrated template, and its
// own Redis key prefix, so tests run in parallel.
package oncetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	neturl "net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/migrations"
)

const howToStart = `run the tests with "make test" (scripts/test.sh starts local servers), or with a
Docker engine: go run ./tools/testservers -- go test ./..., or export
TEST_DATABASE_URL=postgres://... and TEST_REDIS_URL=redis://...`

var (
	adminOnce sync.Once
	adminURL  string
	errAdmin  error

	redisOnce sync.Once
	redisURL  string
	errRedis  error

	templateOnce sync.Once
	templateName string
	errTemplate  error

	alsoMu      sync.Mutex
	alsoMigrate []migrationSet
)

// migrationSet is a set of migrations AlsoMigrate added: its files (hashed
// into the template's name) and the option that selects them.
type migrationSet struct {
	files fs.FS
	opt   migrations.Option
}

// AlsoMigrate adds an application's own migrations (files, selected by opt
// — see migrations.WithFiles) to every database this package makes, after
// the engine's. Call it before the first database is made: from TestMain or
// an init function.
func AlsoMigrate(files fs.FS, opt migrations.Option) {
	alsoMu.Lock()
	defer alsoMu.Unlock()
	alsoMigrate = append(alsoMigrate, migrationSet{files: files, opt: opt})
}

// migrationSets is the engine's migrations followed by AlsoMigrate's.
func migrationSets() []migrationSet {
	alsoMu.Lock()
	defer alsoMu.Unlock()
	return append([]migrationSet{{files: migrations.FS()}}, alsoMigrate...)
}

// Context returns a context that ends with the test (or after two minutes).
func Context(tb testing.TB) context.Context {
	return ContextFor(tb, 2*time.Minute)
}

// ContextFor returns a context that ends with the test or after d, for
// tests whose length is set from outside (the chaos suite's duration).
func ContextFor(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// RandomSuffix returns n random lowercase hex characters.
func RandomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// AdminDatabaseURL returns the URL of the server's maintenance database.
func AdminDatabaseURL(tb testing.TB) string {
	tb.Helper()
	adminOnce.Do(func() {
		if adminURL = os.Getenv("TEST_DATABASE_URL"); adminURL == "" {
			errAdmin = errors.New("TEST_DATABASE_URL is unset")
		}
	})
	if errAdmin != nil {
		tb.Fatalf("no Postgres for tests: %v\n%s", errAdmin, howToStart)
	}
	return adminURL
}

// DatabaseURL creates a fresh, migrated database for the test and returns
// its URL; the database is dropped when the test ends.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	admin := AdminDatabaseURL(tb)
	tmpl := template(tb, admin)
	url, drop, err := newDatabase(admin, tmpl)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Logf("%v", err)
		}
	})
	return url
}

// EmptyDatabaseURL creates a database without the schema (no migration
// applied), dropped when the test ends.
func EmptyDatabaseURL(tb testing.TB) string {
	tb.Helper()
	url, drop, err := newDatabase(AdminDatabaseURL(tb), "template0")
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() { _ = drop() })
	return url
}

// Redis logical databases of the packages whose runnable examples use
// Redis: one each, flushed when the package's examples start, so an
// example's keys never meet another package's or an earlier run's.
var exampleRedisDB = map[string]int{
	"onceonly": 1, "onceriver": 2, "onceamqp": 3, "oncenats": 4, "oncewatermill": 5, "sqlexample": 6, "quickstart": 7, "oncesqs": 8, "oncekafka": 9,
}

// TestingM is what TestMain runs: *testing.M, or a wrapper of it.
type TestingM interface{ Run() int }

// WithExampleEnv wraps m (for TestMain: goleak.VerifyTestMain(
// oncetest.WithExampleEnv(m, "onceonly"))) so that its Run runs the
// package's tests and runnable examples with the environment a user's
// program reads: DATABASE_URL, a
// fresh empty database of the run's own (examples migrate it, as users
// do), and REDIS_URL, the test Redis's logical database reserved for pkg
// (see exampleRedisDB), emptied first; NATS_URL and AMQP_URL are the test
// brokers when scripts/test.sh started them. Examples then need no test helper:
// they read os.Getenv("DATABASE_URL") as the code a user copies does.
func WithExampleEnv(m TestingM, pkg string) TestingM {
	return exampleEnv{m: m, pkg: pkg}
}

type exampleEnv struct {
	m   TestingM
	pkg string
}

func (e exampleEnv) Run() int {
	m, pkg := e.m, e.pkg
	admin, rawRedis := os.Getenv("TEST_DATABASE_URL"), os.Getenv("TEST_REDIS_URL")
	index, ok := exampleRedisDB[pkg]
	if admin == "" || rawRedis == "" || !ok {
		fmt.Fprintf(os.Stderr, "examples need TEST_DATABASE_URL, TEST_REDIS_URL and a Redis database for %q: %s\n", pkg, howToStart)
		return 1
	}
	url, drop, err := newDatabase(admin, "template0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = drop() }()
	u, err := neturl.Parse(rawRedis)
	if err != nil {
		fmt.Fprintln(os.Stderr, "TEST_REDIS_URL:", err)
		return 1
	}
	u.Path = "/" + strconv.Itoa(index)
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		fmt.Fprintln(os.Stderr, "TEST_REDIS_URL:", err)
		return 1
	}
	rdb := redis.NewClient(opts)
	err = rdb.FlushDB(context.Background()).Err()
	_ = rdb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "empty the examples' Redis database:", err)
		return 1
	}
	_ = os.Setenv("DATABASE_URL", url)
	_ = os.Setenv("REDIS_URL", u.String())
	// The brokers' examples name their stream or queue per package.
	for name, test := range map[string]string{"NATS_URL": "TEST_NATS_URL", "AMQP_URL": "TEST_AMQP_URL"} {
		if v := os.Getenv(test); v != "" && os.Getenv(name) == "" {
			_ = os.Setenv(name, v)
		}
	}
	return m.Run()
}

func newDatabase(admin, tmpl string) (string, func() error, error) {
	ctx := context.Background()
	name := "onceonly_test_" + RandomSuffix(12)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("connect to Postgres (%s): %w\n%s", redact(admin), err, howToStart)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tmpl); err != nil {
		return "", nil, fmt.Errorf("create test database: %w", err)
	}
	drop := func() error {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return fmt.Errorf("drop test database: %w", err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop test database: %w", err)
		}
		return nil
	}
	u, err := neturl.Parse(admin)
	if err != nil {
		return "", nil, fmt.Errorf("parse database URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// DB returns a pool on a fresh, migrated database of the test's own.
func DB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return Pool(tb, DatabaseURL(tb))
}

// Pool opens a pool on url that is closed when the test ends.
func Pool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func redact(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// template returns the name of a database holding every migration, built
// once per migration set and shared by all test processes.
func template(tb testing.TB, admin string) string {
	tb.Helper()
	templateOnce.Do(func() { templateName, errTemplate = buildTemplate(admin) })
	if errTemplate != nil {
		tb.Fatalf("build template database: %v", errTemplate)
	}
	return templateName
}

// MigrateUp runs the engine's migrations, then those AlsoMigrate added.
func MigrateUp(ctx context.Context, pool *pgxpool.Pool) error {
	for _, set := range migrationSets() {
		var opts []migrations.Option
		if set.opt != nil {
			opts = append(opts, set.opt)
		}
		m, err := migrations.NewMigrator(pool, opts...)
		if err != nil {
			return err
		}
		_, err = m.Up(ctx)
		_ = m.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func buildTemplate(admin string) (string, error) {
	ctx := context.Background()
	sum := sha256.New()
	sum.Write([]byte(migrations.VersionTable)) // where the versions are recorded is part of the schema
	for _, set := range migrationSets() {
		files := set.files
		err := fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(files, path)
			if err != nil {
				return fmt.Errorf("read %s: %w", path, err)
			}
			sum.Write([]byte(path))
			sum.Write(b)
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("hash migrations: %w", err)
		}
	}
	name := "onceonly_tpl_" + hex.EncodeToString(sum.Sum(nil))[:12]

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to Postgres (%s): %w", redact(admin), err)
	}
	defer conn.Close(ctx)
	// Test binaries of several packages run at once: one builds, the rest wait.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return "", fmt.Errorf("lock template: %w", err)
	}
	defer conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1))", name) //nolint:errcheck // the connection closes anyway
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop half-built template: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	u, _ := neturl.Parse(admin)
	u.Path = "/" + building
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return "", fmt.Errorf("open template: %w", err)
	}
	err = MigrateUp(ctx, pool)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+building+" RENAME TO "+name); err != nil {
		return "", fmt.Errorf("rename template: %w", err)
	}
	return name, nil
}

// RedisURL returns the URL of the shared test Redis.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	redisOnce.Do(func() {
		if redisURL = os.Getenv("TEST_REDIS_URL"); redisURL == "" {
			errRedis = errors.New("TEST_REDIS_URL is unset")
		}
	})
	if errRedis != nil {
		tb.Fatalf("no Redis for tests: %v\n%s", errRedis, howToStart)
	}
	return redisURL
}

// Redis returns a client of the shared test Redis and a key prefix of the
// test's own; the test's keys are deleted when it ends.
func Redis(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	rdb := RedisClient(tb, RedisURL(tb))
	return rdb, KeyPrefix(tb, rdb)
}

// KeyPrefix returns a Redis key prefix of the test's own; its keys are
// deleted from rdb (every master of a cluster) when the test ends.
func KeyPrefix(tb testing.TB, rdb redis.UniversalClient) string {
	prefix := "t" + RandomSuffix(10) + ":"
	tb.Cleanup(func() { deletePrefix(rdb, prefix) })
	return prefix
}

// deletePrefix deletes every key under prefix, on every master.
func deletePrefix(rdb redis.UniversalClient, prefix string) {
	_ = cache.ForEachNode(context.Background(), rdb, func(ctx context.Context, node redis.UniversalClient) error {
		iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			node.Del(ctx, iter.Val())
		}
		return iter.Err()
	})
}

// OnEachRedis runs fn twice, as the subtests "single" (on the shared test
// Redis) and "cluster" (on the shared test Redis Cluster): code that talks to
// Redis is tested on both. fn takes its key prefixes from KeyPrefix.
func OnEachRedis(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	t.Run("single", func(t *testing.T) { fn(t, RedisClient(t, RedisURL(t))) })
	t.Run("cluster", func(t *testing.T) { fn(t, RedisClusterClient(t)) })
}

// RedisClient opens a client on url that is closed when the test ends.
func RedisClient(tb testing.TB, url string) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("parse Redis URL: %v", err)
	}
	rdb := redis.NewClient(opts)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("connect to Redis (%s): %v\n%s", redact(url), err, howToStart)
	}
	// Closed after the key cleanup above, which was registered later.
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func init() { //nolint:gochecknoinits // must run before any test opens a client, whichever helper it calls first
	// Tests stop Redis on purpose; go-redis's own dial-failure lines are noise.
	logging.Disable()
}

// RedisEnv returns the environment that points a command at rdb's server:
// REDIS_URL for a single node, REDIS_CLUSTER_URL for a cluster, plus
// REDIS_PREFIX.
func RedisEnv(rdb redis.UniversalClient, prefix string) map[string]string {
	env := map[string]string{"REDIS_PREFIX": prefix}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		env["REDIS_CLUSTER_URL"] = ClusterURL(c.Options().Addrs)
	case *redis.Client:
		env["REDIS_URL"] = fmt.Sprintf("redis://%s/%d", c.Options().Addr, c.Options().DB)
	}
	return env
}
