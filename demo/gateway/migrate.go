package gateway

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

const (
	// schema is the Postgres schema that holds everything of the gateway's.
	schema = "gateway"
	// versionTable is goose's version table of the gateway's migrations,
	// inside schema (apart from the engine's onceonly_db_version).
	versionTable = schema + ".goose_db_version"
	// lockTable holds goose's table lock of the gateway's migrators, inside
	// schema, apart from the engine's onceonly_migrate_lock.
	lockTable = schema + ".goose_lock"
	// migrateLockID is the lock the gateway's migrators share (its row in
	// lockTable, and the advisory lock that guards creating schema):
	// crc32("onceonly/gateway").
	migrateLockID int64 = 1900450317
)

// migrationsFS returns the gateway's embedded goose migrations (a plain goose
// folder, so the goose CLI works on it too).
func migrationsFS() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the folder is embedded above
	}
	return sub
}

// Migrate brings the gateway's schema up to date: it creates schema gateway
// and runs the embedded migrations through a goose Provider whose version
// table is gateway.goose_db_version. goose's table lock, a leased row in
// gateway.goose_lock, serialises concurrent migrators (several gateway
// processes starting at once); it needs no session, so it works through
// PgBouncer in transaction mode. The engine's tables, version table and
// lock table are not touched.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return errors.New("gateway: migrate: no Postgres pool")
	}
	// goose creates its version table before the first migration runs, so
	// the schema that holds it must exist first. CREATE SCHEMA IF NOT EXISTS
	// is not safe against a concurrent twin (unique violation), hence the
	// transaction-scoped lock.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockID); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gateway: migrate: %w", err)
	}

	locker, err := lock.NewPostgresTableLocker(lock.WithTableName(lockTable), lock.WithTableLockID(migrateLockID),
		lock.WithTableLockTimeout(250*time.Millisecond, 480)) // a try every 250 ms for two minutes
	if err != nil {
		return fmt.Errorf("gateway: migrate: create table locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrationsFS(),
		goose.WithTableName(versionTable),
		goose.WithLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("gateway: migrate: create migration provider: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("gateway: migrate up: %w", err)
	}
	return nil
}
