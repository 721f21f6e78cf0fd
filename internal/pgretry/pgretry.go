// Package pgretry tells a statement that never ran on a dead pooled
// connection (Postgres restarted) from one that may have, and runs the
// first kind once more on a live one.
package pgretry

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DeadConnection reports whether err says a statement never ran because its
// pooled connection was dead: nothing was sent (pgconn.SafeToRetry), or the
// server's first answer was that it had ended the connection — a restart or
// a failover (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now) — which it sends before, never after, a result.
func DeadConnection(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Severity != "FATAL" {
		return false
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P03":
		return true
	}
	return false
}

// OnLiveConnection runs op, and once more when it failed on a dead pooled
// connection. The pool's other idle connections died the same way (a
// restart ends them all), so they are closed first: the second try dials,
// instead of meeting the next dead one. A restart thus costs no request.
func OnLiveConnection[T any](ctx context.Context, pool *pgxpool.Pool, op func() (T, error)) (T, error) {
	v, err := op()
	if err == nil || ctx.Err() != nil || !DeadConnection(err) {
		return v, err
	}
	pool.Reset()
	return op()
}
