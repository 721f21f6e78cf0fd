package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// TryLock takes the advisory lock key for tx, a transaction, unless another
// session holds it, without waiting; it reports whether it did. The lock
// ends with tx (commit, rollback or a lost connection), so it works on any
// connection, a PgBouncer's in transaction mode included, where a session
// lock would stay on a server connection other clients then get.
func (s *Store) TryLock(ctx context.Context, tx pgx.Tx, key int64) (bool, error) {
	var locked bool
	var timeout string
	if err := tryLockSQL.queryRow(ctx, tx, pgx.StrictNamedArgs{"lock_key": key}).Scan(&locked, &timeout); err != nil {
		return false, fmt.Errorf("try advisory lock: %w", err)
	}
	return locked, nil
}

// ReapLeases marks up to limit in_progress keys whose lease expired more
// than grace ago failed (retryable), each with an outbox event, so a key
// whose worker died is released even if no client retries (I5). It returns
// how many it reaped.
//
// On a distributed database (Citus) it reaps scope by scope (reapByScope).
func (s *Store) ReapLeases(ctx context.Context, db DB, grace time.Duration, limit int) (int, error) {
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("reap leases: %w", err)
	}
	if byScope {
		return s.reapByScope(ctx, db, grace, limit)
	}
	var n int
	var notified bool
	err = reapLeasesSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"grace": grace, "ttl": s.cfg.FailedTTL, "limit": limit,
		"channel": NotifyChannel}).Scan(&n, &notified)
	if err != nil {
		return 0, fmt.Errorf("reap leases: %w", err)
	}
	return n, nil
}

// CountReapable counts the keys ReapLeases would reap.
func (s *Store) CountReapable(ctx context.Context, db DB, grace time.Duration) (int, error) {
	var n int
	if err := countReapableSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"grace": grace}).Scan(&n); err != nil {
		return 0, fmt.Errorf("count reapable leases: %w", err)
	}
	return n, nil
}

// DeleteExpired deletes up to limit keys past their expiry, through the
// expires_at index and skipping locked rows, so each call is short and
// holds few locks. Redis needs no event: its TTLs follow the same expiry.
//
// First it raises the version floor over the keys it is about to delete
// (raise_version_floor), so a key created again starts above every version
// it had; on a pool that raise commits before the delete runs (see the
// statement for why). A key whose version the floor does not cover yet (it
// expired in between) waits for the next call. On a distributed database
// (Citus) the delete runs scope by scope (deleteExpiredByScope).
func (s *Store) DeleteExpired(ctx context.Context, db DB, limit int) (int, error) {
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("delete expired keys: %w", err)
	}
	if _, err := raiseVersionFloorSQL.exec(ctx, db, pgx.StrictNamedArgs{"limit": limit}); err != nil {
		return 0, fmt.Errorf("delete expired keys: raise the version floor: %w", err)
	}
	if byScope {
		return s.deleteExpiredByScope(ctx, db, limit)
	}
	tag, err := deleteExpiredSQL.exec(ctx, db, pgx.StrictNamedArgs{"limit": limit})
	if err != nil {
		return 0, fmt.Errorf("delete expired keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// CountExpired counts the keys DeleteExpired would delete.
func (s *Store) CountExpired(ctx context.Context, db DB) (int, error) {
	var n int
	if err := countExpiredSQL.queryRow(ctx, db, nil).Scan(&n); err != nil {
		return 0, fmt.Errorf("count expired keys: %w", err)
	}
	return n, nil
}

// ScanLive calls fn with every live (unexpired) key, Ref, Status and
// Version read, as one statement streams them: one snapshot, so a row that
// exists when the scan starts is read exactly once however rows move while
// it runs, in the table's physical order (a sequential scan, not a heap
// read per key). Rows arrive as fn consumes them, so memory does not grow
// with the table. tx is the transaction to run it in; the statement runs as
// long as the scan, so statement_timeout is lifted for the transaction.
// When fn returns an error the scan stops with it.
func (s *Store) ScanLive(ctx context.Context, tx pgx.Tx, fn func(keystate.Key) error) error {
	if _, err := liftStatementTimeoutSQL.exec(ctx, tx, nil); err != nil {
		return fmt.Errorf("scan keys: lift statement_timeout: %w", err)
	}
	rows, err := scanLiveSQL.query(ctx, tx, nil)
	if err != nil {
		return fmt.Errorf("scan keys: %w", err)
	}
	defer rows.Close()
	var k keystate.Key
	for rows.Next() {
		if err := rows.Scan(&k.Scope, &k.Key, &k.Status, &k.Version); err != nil {
			return fmt.Errorf("scan keys: %w", err)
		}
		if err := fn(k); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("scan keys: %w", err)
	}
	return nil
}

// Live reports which of refs have a live (unexpired) row.
func (s *Store) Live(ctx context.Context, db DB, refs []keystate.Ref) (map[keystate.Ref]bool, error) {
	scopes, keys := refColumns(refs)
	rows, err := liveKeysSQL.query(ctx, db, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys})
	if err != nil {
		return nil, fmt.Errorf("look up keys: %w", err)
	}
	defer rows.Close()
	live := make(map[keystate.Ref]bool, len(refs))
	for rows.Next() {
		var r keystate.Ref
		if err := rows.Scan(&r.Scope, &r.Key); err != nil {
			return nil, fmt.Errorf("look up keys: %w", err)
		}
		live[r] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up keys: %w", err)
	}
	return live, nil
}

// StepState is a step an execution in progress recorded.
type StepState struct {
	// Name is the step's name.
	Name string
	// Settled is true once the step's outcome is recorded; false while
	// only its intent is (its call is in flight, or its outcome unknown).
	Settled bool
}

// StepsInProgress reads the recorded steps of those of refs that are in
// progress, by key, in name order; a key in progress with no step, or not
// in progress, is absent from the result.
func (s *Store) StepsInProgress(ctx context.Context, db DB, refs []keystate.Ref) (map[keystate.Ref][]StepState, error) {
	scopes, keys := refColumns(refs)
	rows, err := stepsInProgressSQL.query(ctx, db, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys})
	if err != nil {
		return nil, fmt.Errorf("read steps in progress: %w", err)
	}
	defer rows.Close()
	steps := map[keystate.Ref][]StepState{}
	for rows.Next() {
		var r keystate.Ref
		var st StepState
		if err := rows.Scan(&r.Scope, &r.Key, &st.Name, &st.Settled); err != nil {
			return nil, fmt.Errorf("read steps in progress: %w", err)
		}
		steps[r] = append(steps[r], st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read steps in progress: %w", err)
	}
	return steps, nil
}

// ErrKeyInProgress is returned by Purge for a key whose lease is held,
// unless forced.
var ErrKeyInProgress = errors.New("the key is in progress; purging it lets a duplicate run")

// Purge forgets ref: it expires the row at once, through the outbox like
// any transition, so no relay or reconciler can bring the old state back.
// It returns the row as purged (ExpiresIn ≤ 0), false if there was no row,
// or ErrKeyInProgress for a held key unless force.
func (s *Store) Purge(ctx context.Context, db DB, ref keystate.Ref, force bool) (keystate.Key, bool, error) {
	var notified bool
	k, err := scanKey(purgeSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "force": force,
		"channel": NotifyChannel}), &notified)
	if err == nil {
		return k, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return keystate.Key{}, false, fmt.Errorf("purge key: %w", err)
	}
	current, found, err := s.Get(ctx, db, ref)
	switch {
	case err != nil:
		return keystate.Key{}, false, fmt.Errorf("purge key: %w", err)
	case found && current.Status == keystate.InProgress:
		return current, true, ErrKeyInProgress
	}
	return keystate.Key{}, false, nil
}
