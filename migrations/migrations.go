// Package migrations holds the goose SQL migrations of onceonly, embedded in
// the binary, and runs them through a goose Provider that takes goose's
// table lock (a leased row in goose_lock), so two migrators never race. A
// table lock needs no session: it works through PgBouncer in transaction
// mode, where a session advisory lock would stay on a pooled server
// connection. A migrator that dies holding it blocks the next one until its
// lease (30 s) runs out.
//
// The folder stays a plain goose folder: the goose CLI works on it as well.
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

// ErrSchemaBehind is returned by EnsureCurrent when migrations are pending.
var ErrSchemaBehind = errors.New("database schema is behind: run `api migrate up`")

// Migrator runs the embedded migrations against one database.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
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
	o := options{files: files}
	for _, opt := range opts {
		opt(&o)
	}
	lockOpts := []lock.TableLockerOption{lock.WithTableLockTimeout(lockRetryInterval, lockRetries)}
	gooseOpts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if o.versionTable != "" {
		lockOpts = append(lockOpts, lock.WithTableName(o.lockTable), lock.WithTableLockID(o.lockID))
		gooseOpts = append(gooseOpts, goose.WithTableName(o.versionTable))
	}
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
	return &Migrator{db: db, provider: provider}, nil
}

// Provider returns the underlying goose provider (for status, down, and so on).
func (m *Migrator) Provider() *goose.Provider { return m.provider }

// Close releases the migrator's database handle.
func (m *Migrator) Close() error {
	if err := m.db.Close(); err != nil {
		return fmt.Errorf("close the migration database: %w", err)
	}
	return nil
}

// Up applies every pending migration and returns how many ran.
func (m *Migrator) Up(ctx context.Context) (int, error) {
	results, err := m.provider.Up(ctx)
	if err != nil {
		return len(results), fmt.Errorf("migrate up: %w", err)
	}
	return len(results), nil
}

// EnsureCurrent returns ErrSchemaBehind (wrapped with the versions) when the
// database lacks a migration this binary knows, so a daemon refuses to start
// on an outdated schema.
func EnsureCurrent(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
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
