// Package schemaver knows where the engine's schema version is recorded
// and which version this release needs, so the engine (onceonly.New) can
// refuse a database whose schema is missing or behind without importing
// goose: one statement, once. The migrations package records the versions
// (and checks Latest against its embedded files in its tests).
package schemaver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// VersionTable is goose's version table of the engine's migrations:
	// its own, so an application's goose migrations (goose_db_version,
	// goose's default) never meet the engine's. Unqualified, like every
	// table of the engine: in the first schema of the search_path.
	VersionTable = "onceonly_db_version"
	// LockTable holds goose's table lock of the engine's migrators, apart
	// from an application's goose_lock.
	LockTable = "onceonly_migrate_lock"
	// LegacyVersionTable is goose's default version table, where releases
	// before VersionTable recorded the engine's migrations.
	LegacyVersionTable = "goose_db_version"
	// Latest is the version of the last embedded migration: the schema
	// this release needs.
	Latest int64 = 10
)

// ErrBehind is returned when the database lacks migrations this release
// needs (or the engine's schema altogether).
var ErrBehind = errors.New("onceonly: the database schema is missing or behind this release: run migrations.Up(ctx, pool) before onceonly.New, or `api migrate up`")

// Querier is what Check reads through (a *pgxpool.Pool, a *pgx.Conn).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check returns nil when the database's engine schema is at Latest or
// later, an error wrapping ErrBehind (with what it found) when it is
// missing or behind, and another error when the database could not be
// asked. It runs one statement; a second only to explain a missing table.
func Check(ctx context.Context, q Querier) error {
	var version *int64
	err := q.QueryRow(ctx, `SELECT max(version_id) FROM `+VersionTable).Scan(&version)
	switch {
	case err == nil:
	case isUndefined(err):
		return fmt.Errorf("%w (%s)", ErrBehind, missing(ctx, q))
	default:
		return fmt.Errorf("onceonly: read the schema version (%s): %w", VersionTable, err)
	}
	current := int64(0)
	if version != nil {
		current = *version
	}
	if current < Latest {
		return fmt.Errorf("%w (database at version %d, this release needs %d)", ErrBehind, current, Latest)
	}
	return nil
}

// missing explains a missing version table: no engine schema at all, or
// one an earlier release migrated (its versions in goose_db_version).
func missing(ctx context.Context, q Querier) string {
	var keys, legacy bool
	err := q.QueryRow(ctx, `SELECT to_regclass('idempotency_keys') IS NOT NULL, to_regclass($1) IS NOT NULL`, LegacyVersionTable).Scan(&keys, &legacy)
	switch {
	case err == nil && keys && legacy:
		return "no " + VersionTable + " table: the schema was migrated by an earlier release, which recorded its versions in " +
			LegacyVersionTable + "; migrations.Up moves them and runs the migrations since"
	case err == nil && keys:
		return "no " + VersionTable + " table, though idempotency_keys exists"
	}
	return "no " + VersionTable + " table in the search_path: the database has no onceonly schema"
}

// isUndefined reports whether err is Postgres saying an object the
// statement names does not exist: a table (42P01), a function (42883) or
// a column (42703).
func isUndefined(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "42P01", "42883", "42703":
		return true
	}
	return false
}

// engineObjects are the names of the engine's tables and functions (and
// their prefixes) as Postgres quotes them in an "undefined" error.
var engineObjects = []string{`"idempotency_`, `"outbox`, `"onceonly_`, `onceonly_key_`}

// MissingObject reports whether err is Postgres saying one of the engine's
// own tables, columns or functions does not exist: the schema is behind
// (or gone) though New found it current, or New's check was skipped. An
// application's missing table is not one.
func MissingObject(err error) bool {
	if !isUndefined(err) {
		return false
	}
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	for _, name := range engineObjects {
		if strings.Contains(pgErr.Message, name) {
			return true
		}
	}
	return false
}
