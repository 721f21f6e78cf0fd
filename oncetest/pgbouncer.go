package oncetest

import (
	"net/url"
	"os"
	"testing"
)

// PgBouncerURL returns a URL reaching the database of dbURL (a test's
// database on the TEST_DATABASE_URL server) through the PgBouncer of
// TEST_PGBOUNCER_URL, which pools in transaction mode in front of that
// server, with pgx's default_query_exec_mode set to mode ("exec" or
// "simple_protocol": the modes that work through it).
//
// scripts/test.sh always starts that PgBouncer and sets TEST_PGBOUNCER_URL;
// elsewhere a test without it is skipped, except under CI, where it fails.
func PgBouncerURL(tb testing.TB, dbURL, mode string) string {
	tb.Helper()
	bouncer := os.Getenv("TEST_PGBOUNCER_URL")
	if bouncer == "" {
		const how = "TEST_PGBOUNCER_URL is unset: start one with `scripts/services.sh pgbouncer DIR PG_PORT PORT` " +
			"(or run scripts/test.sh, which does) and export TEST_PGBOUNCER_URL=postgres://postgres@127.0.0.1:PORT/postgres"
		if os.Getenv("CI") != "" {
			tb.Fatal(how)
		}
		tb.Skip(how)
	}
	db, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("parse database URL: %v", err)
	}
	u, err := url.Parse(bouncer)
	if err != nil {
		tb.Fatalf("parse TEST_PGBOUNCER_URL: %v", err)
	}
	u.Path = db.Path
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}
