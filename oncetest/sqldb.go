package oncetest

import (
	"database/sql"
	"net/url"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"
)

// SQLDrivers are the database/sql drivers over Postgres that the engine's
// database/sql path is tested with: pgx's stdlib ("pgx"), lib/pq
// ("postgres"), and lib/pq sending arguments in binary, which takes a
// statement with arguments in one round trip instead of two
// ("postgres-binary": binary_parameters=yes).
var SQLDrivers = []string{"pgx", libPQ, libPQBinary}

// The names of lib/pq's driver, and of SQLDrivers' variant of it that
// sends arguments in binary.
const (
	libPQ       = "postgres"
	libPQBinary = "postgres-binary"
)

// OnEachSQLDriver runs fn as a parallel subtest per driver of SQLDrivers.
func OnEachSQLDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	t.Helper()
	for _, driver := range SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			fn(t, driver)
		})
	}
}

// SQLDB opens a database/sql handle on dsn with driver, one of
// SQLDrivers, closed when the test ends.
func SQLDB(tb testing.TB, driver, dsn string) *sql.DB {
	tb.Helper()
	if driver == libPQBinary {
		u, err := url.Parse(dsn)
		if err != nil {
			tb.Fatalf("parse database URL: %v", err)
		}
		q := u.Query()
		q.Set("binary_parameters", "yes")
		u.RawQuery = q.Encode()
		driver, dsn = libPQ, u.String()
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		tb.Fatalf("open %s: %v", driver, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}
