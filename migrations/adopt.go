package migrations

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/schemaver"
)

// Adoption is what Adopt did.
type Adoption struct {
	// Versions are the engine's versions an earlier release recorded in
	// goose_db_version, now recorded in VersionTable too (ascending); none
	// when there was nothing to take over.
	Versions []int64
	// Removed is true when Versions were deleted from goose_db_version:
	// it recorded them and nothing else, so they were the engine's alone.
	Removed bool
}

// Adopt takes over the engine's versions that releases before this one
// recorded in goose's default table, goose_db_version, so that Up does not
// run them again; Up calls it first. It does something only when all of
// these hold, in the first schema of the search_path (current_schema(),
// where those releases created both their tables and goose_db_version):
//
//   - goose_db_version and the engine's idempotency_keys exist;
//   - VersionTable records no version yet (this release has not migrated
//     the database, nor adopted it before);
//   - goose_db_version records the first of the embedded migrations as
//     applied (version 1).
//
// It then records in VersionTable the longest run of embedded versions,
// from 1 on, that goose_db_version records as applied (with their times),
// and deletes them from goose_db_version only when it recorded nothing
// else (no other version, applied or not): rows of an application's own
// goose migrations cannot be told from the engine's when their versions
// overlap, so a table that holds any other version is left to the
// application as it is. goose_db_version itself and its version 0 row
// stay. Concurrent callers take turns (an advisory lock of the
// transaction, which works through PgBouncer in transaction mode).
//
// Adopt of a Migrator of other migrations (WithFiles) does nothing.
func (m *Migrator) Adopt(ctx context.Context) (Adoption, error) {
	if !m.engine {
		return Adoption{}, nil
	}
	embedded := make([]int64, 0, len(m.provider.ListSources()))
	for _, src := range m.provider.ListSources() {
		embedded = append(embedded, src.Version)
	}
	slices.Sort(embedded)
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		return Adoption{}, fmt.Errorf("adopt the versions in %s: %w", schemaver.LegacyVersionTable, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	a, err := adopt(ctx, tx, embedded)
	if err != nil {
		return Adoption{}, fmt.Errorf("adopt the versions in %s: %w", schemaver.LegacyVersionTable, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Adoption{}, fmt.Errorf("adopt the versions in %s: %w", schemaver.LegacyVersionTable, err)
	}
	return a, nil
}

func adopt(ctx context.Context, tx pgx.Tx, embedded []int64) (Adoption, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockID); err != nil {
		return Adoption{}, fmt.Errorf("lock: %w", err)
	}
	var schema *string
	if err := tx.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return Adoption{}, fmt.Errorf("read current_schema(): %w", err)
	}
	if schema == nil {
		return Adoption{}, nil // no schema of the search_path exists: nothing was migrated
	}
	legacy := pgx.Identifier{*schema, schemaver.LegacyVersionTable}.Sanitize()
	own := pgx.Identifier{*schema, schemaver.VersionTable}.Sanitize()
	var hasLegacy, hasOwn, hasKeys bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL`,
		legacy, own, pgx.Identifier{*schema, "idempotency_keys"}.Sanitize()).Scan(&hasLegacy, &hasOwn, &hasKeys); err != nil {
		return Adoption{}, fmt.Errorf("look up the tables: %w", err)
	}
	if !hasLegacy || !hasKeys {
		return Adoption{}, nil
	}
	if hasOwn {
		var recorded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+own+` WHERE version_id > 0)`).Scan(&recorded); err != nil {
			return Adoption{}, fmt.Errorf("read %s: %w", own, err)
		}
		if recorded {
			return Adoption{}, nil
		}
	}
	// A version is applied when its latest row says so (goose's reading).
	rows, err := tx.Query(ctx, `SELECT DISTINCT ON (version_id) version_id, is_applied, tstamp FROM `+legacy+`
		WHERE version_id > 0 ORDER BY version_id, id DESC`)
	if err != nil {
		return Adoption{}, fmt.Errorf("read %s: %w", legacy, err)
	}
	applied := map[int64]time.Time{}
	var version int64
	var isApplied bool
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&version, &isApplied, &at}, func() error {
		if isApplied {
			applied[version] = at
		}
		return nil
	}); err != nil {
		return Adoption{}, fmt.Errorf("read %s: %w", legacy, err)
	}
	var a Adoption
	for _, v := range embedded {
		if _, ok := applied[v]; !ok {
			break
		}
		a.Versions = append(a.Versions, v)
	}
	if len(a.Versions) == 0 {
		return Adoption{}, nil // goose_db_version is the application's
	}
	if !hasOwn {
		// goose's own table (as its Postgres dialect makes it) and its
		// version 0 row.
		if _, err := tx.Exec(ctx, `CREATE TABLE `+own+` (
			id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
			version_id bigint NOT NULL,
			is_applied boolean NOT NULL,
			tstamp timestamp NOT NULL DEFAULT now()
		)`); err != nil {
			return Adoption{}, fmt.Errorf("create %s: %w", own, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+own+` (version_id, is_applied) VALUES (0, true)`); err != nil {
			return Adoption{}, fmt.Errorf("write %s: %w", own, err)
		}
	}
	for _, v := range a.Versions {
		if _, err := tx.Exec(ctx, `INSERT INTO `+own+` (version_id, is_applied, tstamp) VALUES ($1, true, $2)`, v, applied[v]); err != nil {
			return Adoption{}, fmt.Errorf("write %s: %w", own, err)
		}
	}
	var others int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+legacy+` WHERE version_id > 0 AND NOT (version_id = ANY($1))`, a.Versions).Scan(&others); err != nil {
		return Adoption{}, fmt.Errorf("read %s: %w", legacy, err)
	}
	if others == 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM `+legacy+` WHERE version_id = ANY($1)`, a.Versions); err != nil {
			return Adoption{}, fmt.Errorf("delete the engine's versions from %s: %w", legacy, err)
		}
		a.Removed = true
	}
	return a, nil
}
