package console

import (
	"context"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// sqlFiles holds the console's reads, one statement per file.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// A statement of sql/, with named parameters (@name). Each runs in exec mode
// (pgx.QueryExecModeExec: an unnamed statement, planned with its
// arguments), so an optional filter written `@x = ” OR col = @x` folds
// away and the rest becomes an index condition, as no generic plan of a
// prepared statement could; a console's reads are rare enough that
// planning each costs nothing that matters. Exec mode also works through
// PgBouncer in transaction mode.
var (
	keysPageSQL            = load("keys_page")
	keyCollationSQL        = load("key_collation")
	keyDetailSQL           = load("key_detail")
	keysByStateSQL         = load("keys_by_state")
	keysByStateEstimateSQL = load("keys_by_state_estimate")
	tableSizeSQL           = load("table_size")
	executionsSQL          = load("executions")
	oldestLeasesSQL        = load("oldest_leases")
	outboxBacklogSQL       = load("outbox_backlog")
	reconcilePassesSQL     = load("reconcile_passes")
	parkedEventsSQL        = load("parked_events")
)

// The parameters several statements share.
const (
	paramScope = "scope"
	paramKey   = "key"
	paramLimit = "limit"
)

// readTimeout bounds every statement a page runs.
const readTimeout = 5 * time.Second

// setStatementTimeoutSQL sets statement_timeout for the read's transaction.
const setStatementTimeoutSQL = `SELECT set_config('statement_timeout', @timeout, true)`

// load reads sql/name.sql; a file missing is a bug of this package, so it
// panics when the package loads, before any binary or test starts.
func load(name string) string {
	raw, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("console: %v", err))
	}
	return strings.TrimSpace(string(raw))
}

// reader runs the reads of one page in one read-only transaction: a
// console GET cannot write, whatever a statement says, and every statement
// stops after readTimeout.
type reader struct {
	tx pgx.Tx
}

// read runs fn with a reader, in a read-only transaction it rolls back.
func (c *Console) read(ctx context.Context, fn func(ctx context.Context, rd reader) error) error {
	tx, err := c.cfg.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin a read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // nothing to keep
	rd := reader{tx: tx}
	if _, err := tx.Exec(ctx, setStatementTimeoutSQL, pgx.QueryExecModeExec, pgx.NamedArgs{"timeout": fmt.Sprintf("%dms", readTimeout.Milliseconds())}); err != nil {
		return fmt.Errorf("set the statement timeout: %w", err)
	}
	return fn(ctx, rd)
}

// query runs statement sql with args.
func (rd reader) query(ctx context.Context, sql string, args pgx.NamedArgs) (pgx.Rows, error) {
	rows, err := rd.tx.Query(ctx, sql, pgx.QueryExecModeExec, args)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	return rows, nil
}

// queryRow runs statement sql with args, for one row.
func (rd reader) queryRow(ctx context.Context, sql string, args pgx.NamedArgs) pgx.Row {
	return rd.tx.QueryRow(ctx, sql, pgx.QueryExecModeExec, args)
}
