// Package migrations holds the goose SQL migrations of onceonly, embedded in
// the binary, and runs them through a goose Provider that takes goose's
// table lock (a leased row in onceonly_migrate_lock), so two migrators never
// race. A table lock needs no session: it works through PgBouncer in
// transaction mode, where a session advisory lock would stay on a pooled
// server connection. A migrator that dies holding it blocks the next one
// until its lease (30 s) runs out.
//
// The engine's versions are recorded in a goose version table of their own,
// onceonly_db_version (VersionTable), not in goose's default
// goose_db_version, which stays the application's: an application that runs
// goose migrations of its own on the same database never sees the engine's
// versions as its own, nor the other way round. Releases before this one
// recorded them in goose_db_version; Up moves them (see Adopt).
//
// The folder stays a plain goose folder: the goose CLI works on it as well,
// given the table (goose -table onceonly_db_version).
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/onceonly/onceonly/internal/schemaver"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() embed.FS { return files }

// How a migrator waits for another one's lock: a try every
// lockRetryInterval, lockRetries times (two minutes).
const (
	lockRetryInterval = 250 * time.Millisecond
	lockRetries       = 480
)

// ErrSchemaBehind is returned by EnsureCurrent when migrations are pending
// (or the engine's schema is missing). It is onceonly.ErrSchemaBehind,
// which onceonly.New returns on such a database.
var ErrSchemaBehind = schemaver.ErrBehind

// The goose tables of the engine's migrations.
const (
	// VersionTable records the engine's applied migrations.
	VersionTable = schemaver.VersionTable
	// LockTable holds the table lock that serialises the engine's
	// migrators.
	LockTable = schemaver.LockTable
	// lockID is the engine's migrators' row in LockTable, and the advisory
	// lock Adopt takes: an arbitrary constant.
	lockID int64 = 2341053453
)

// Migrator runs the embedded migrations against one database.
type Migrator struct {
	pool     *pgxpool.Pool
	db       *sql.DB
	provider *goose.Provider
	engine   bool // the engine's own migrations (not WithFiles)
}

// Option configures a Migrator.
type Option func(*options)

type options struct {
	files                   fs.FS
	versionTable, lockTable string
	lockID                  int64
}

// WithFiles makes the Migrator run the goose migrations in files instead of
// the engine's, recording them in versionTable and serialising migrators on
// the row lockID of lockTable: an application's own schema beside the
// engine's, with a version sequence of its own (the demo's payments table).
func WithFiles(files fs.FS, versionTable, lockTable string, lockID int64) Option {
	return func(o *options) {
		o.files, o.versionTable, o.lockTable, o.lockID = files, versionTable, lockTable, lockID
	}
}

// NewMigrator returns a Migrator over the pool: of the engine's migrations,
// or of those WithFiles names. Close releases its connections (not the
// pool).
func NewMigrator(pool *pgxpool.Pool, opts ...Option) (*Migrator, error) {
	if pool == nil {
		return nil, errors.New("migrations: the pool is nil")
	}
	o := options{files: files, versionTable: VersionTable, lockTable: LockTable, lockID: lockID}
	for _, opt := range opts {
		opt(&o)
	}
	lockOpts := []lock.TableLockerOption{
		lock.WithTableLockTimeout(lockRetryInterval, lockRetries),
		lock.WithTableName(o.lockTable), lock.WithTableLockID(o.lockID),
	}
	gooseOpts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true), goose.WithTableName(o.versionTable)}
	locker, err := lock.NewPostgresTableLocker(lockOpts...)
	if err != nil {
		return nil, fmt.Errorf("create table locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, o.files,
		append(gooseOpts, goose.WithLocker(locker))...,
	)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create migration provider: %w", err)
	}
	return &Migrator{pool: pool, db: db, provider: provider, engine: o.versionTable == VersionTable}, nil
}

// Provider returns the underlying goose provider (for status, down, and so
// on). On a database an earlier release migrated, call Adopt first (Up
// does), or it reads no version of the engine's as applied.
func (m *Migrator) Provider() *goose.Provider { return m.provider }

// Close releases the migrator's database handle.
func (m *Migrator) Close() error {
	if err := m.db.Close(); err != nil {
		return fmt.Errorf("close the migration database: %w", err)
	}
	return nil
}

// Up applies every pending migration and returns how many ran. On a
// database an earlier release migrated, the engine's Migrator first takes
// over the versions it recorded in goose_db_version (Adopt), so they do not
// run again.
func (m *Migrator) Up(ctx context.Context) (int, error) {
	if _, err := m.Adopt(ctx); err != nil {
		return 0, err
	}
	results, err := m.provider.Up(ctx)
	if err != nil {
		return len(results), fmt.Errorf("migrate up: %w", err)
	}
	return len(results), nil
}

// EnsureCurrent returns ErrSchemaBehind (wrapped with the versions) when the
// database lacks a migration this binary knows, so a daemon refuses to start
// on an outdated schema. Of the engine's migrations it reads VersionTable
// once, as onceonly.New does, and writes nothing.
func EnsureCurrent(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return errors.New("migrations: the pool is nil")
	}
	if len(opts) == 0 {
		return schemaver.Check(ctx, pool)
	}
	m, err := NewMigrator(pool, opts...)
	if err != nil {
		return err
	}
	defer m.Close()
	current, target, err := m.provider.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current < target {
		return fmt.Errorf("%w (database at version %d, binary needs %d)", ErrSchemaBehind, current, target)
	}
	return nil
}

// Up brings the engine's schema in pool's database up to date and returns
// how many migrations ran: the one call a service makes at start (or in
// its deploy step) before New. Concurrent callers wait for one another.
func Up(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	m, err := NewMigrator(pool)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	return m.Up(ctx)
}
