package outbox

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier runs a statement that returns at most one row: all that Claim
// and Complete need, so a key can be claimed and completed in any
// transaction over Postgres. pgx's pools, connections and transactions are
// Queriers as they are; a database/sql transaction is one through SQLTx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLTx is the Querier of a database/sql transaction, of any driver over
// Postgres (pgx's stdlib, lib/pq): the statements are the same files, whose
// @name parameters were numbered ($n) when the package loaded, as every
// Postgres driver takes them. What differs is at the edges, and SQLTx
// bridges it: an interval argument goes as text (database/sql would send a
// time.Duration as a bare integer, which Postgres reads as seconds), a uuid
// comes back as text, and no row is pgx.ErrNoRows.
type SQLTx struct{ Tx *sql.Tx }

// QueryRow runs sql in the transaction.
func (t SQLTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return sqlRow{t.Tx.QueryRowContext(ctx, sql, sqlArgs(args)...)}
}

// sqlArgs returns args with every time.Duration written as an interval
// (in microseconds, its precision in Postgres); args itself is left as
// it was.
func sqlArgs(args []any) []any {
	copied := false
	for i, a := range args {
		d, ok := a.(time.Duration)
		if !ok {
			continue
		}
		if !copied {
			args, copied = slices.Clone(args), true
		}
		args[i] = strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
	}
	return args
}

// sqlRow is the row of SQLTx.QueryRow.
type sqlRow struct{ row *sql.Row }

// Scan reads the row into dest: a uuid into a [16]byte (which
// database/sql cannot scan), and no row as pgx.ErrNoRows.
func (r sqlRow) Scan(dest ...any) error {
	copied := false
	for i, d := range dest {
		u, ok := d.(*[16]byte)
		if !ok {
			continue
		}
		if !copied {
			dest, copied = slices.Clone(dest), true
		}
		dest[i] = (*uuidText)(u)
	}
	err := r.row.Scan(dest...)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return pgx.ErrNoRows
	}
	return fmt.Errorf("database/sql: %w", err)
}

// uuidText scans a uuid that a database/sql driver returns as text.
type uuidText [16]byte

// Scan implements sql.Scanner.
func (u *uuidText) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("scan uuid: got %T", src)
	}
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 2*len(u) {
		return fmt.Errorf("scan uuid: %q", s)
	}
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return fmt.Errorf("scan uuid %q: %w", s, err)
	}
	return nil
}

// inTransaction reports whether db is a transaction (the caller's), which
// a claim must not commit without waiting for its WAL flush: the setting
// would hold for the caller's whole commit.
func inTransaction(db Querier) bool {
	switch db.(type) {
	case pgx.Tx, SQLTx:
		return true
	}
	return false
}

// sqlState returns the SQLSTATE of a Postgres error, whichever driver
// returned it (pgx's *pgconn.PgError, lib/pq's *pq.Error), or "".
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}
