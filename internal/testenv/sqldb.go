package testenv

import (
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"
)

// SQLDrivers are the database/sql drivers over Postgres that the engine's
// database/sql path is tested with: pgx's stdlib and lib/pq.
var SQLDrivers = []string{"pgx", "postgres"}

// OnEachSQLDriver runs fn as a subtest per database/sql driver.
func OnEachSQLDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	t.Helper()
	for _, driver := range SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			fn(t, driver)
		})
	}
}

// SQLDB opens a database/sql handle on url with driver, closed when the
// test ends.
func SQLDB(tb testing.TB, driver, url string) *sql.DB {
	tb.Helper()
	db, err := sql.Open(driver, url)
	if err != nil {
		tb.Fatalf("open %s: %v", driver, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}
