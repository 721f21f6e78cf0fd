package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// reapSQL marks up to $3 keys whose lease ran out more than $1 ago failed,
// as Fail would, one version up with an outbox event. Rows other
// transactions hold are skipped; the next pass gets them.
var reapSQL = `
WITH dead AS (
	SELECT scope, key FROM idempotency_keys
	WHERE status = 'in_progress' AND lease_expires_at < now() - $1::interval
	ORDER BY lease_expires_at LIMIT $3 FOR UPDATE SKIP LOCKED
), reaped AS (
	UPDATE idempotency_keys AS k SET
		status = 'failed', version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		expires_at = now() + $2::interval, updated_at = now()
	FROM dead WHERE k.scope = dead.scope AND k.key = dead.key
	RETURNING k.scope, k.key, k.version
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM reaped
)
SELECT count(*), coalesce(bool_or(pg_notify('` + NotifyChannel + `', '') IS NULL), false) FROM reaped`

// ReapLeases marks up to limit in_progress keys whose lease expired more
// than grace ago failed (retryable), each with an outbox event, so a key
// whose worker died is released even if no client retries (I5). It returns
// how many it reaped.
func (s *Store) ReapLeases(ctx context.Context, db DB, grace time.Duration, limit int) (int, error) {
	var n int
	var notified bool
	if err := db.QueryRow(ctx, reapSQL, grace, s.cfg.FailedTTL, limit).Scan(&n, &notified); err != nil {
		return 0, fmt.Errorf("reap leases: %w", err)
	}
	return n, nil
}

// CountReapable counts the keys ReapLeases would reap.
func (s *Store) CountReapable(ctx context.Context, db DB, grace time.Duration) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE status = 'in_progress' AND lease_expires_at < now() - $1::interval`, grace).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count reapable leases: %w", err)
	}
	return n, nil
}

// DeleteExpired deletes up to limit keys past their expiry, through the
// expires_at index and skipping locked rows, so each call is short and
// holds few locks. Redis needs no event: its TTLs follow the same expiry.
func (s *Store) DeleteExpired(ctx context.Context, db DB, limit int) (int, error) {
	tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys k USING (
			SELECT scope, key FROM idempotency_keys WHERE expires_at <= now()
			ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) old
		WHERE k.scope = old.scope AND k.key = old.key AND k.expires_at <= now()`, limit)
	if err != nil {
		return 0, fmt.Errorf("delete expired keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// CountExpired counts the keys DeleteExpired would delete.
func (s *Store) CountExpired(ctx context.Context, db DB) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count expired keys: %w", err)
	}
	return n, nil
}

// KeyVersion is a key's state and version, as the reconciler compares them.
type KeyVersion struct {
	Ref
	Status  Status
	Version int64
}

// ScanLive returns up to limit live (unexpired) keys after the key after,
// in primary-key order: a keyset page, so a scan of any size reads each row
// once and holds nothing between pages. Start with the zero Ref.
func (s *Store) ScanLive(ctx context.Context, db DB, after Ref, limit int) ([]KeyVersion, error) {
	rows, err := db.Query(ctx, `SELECT scope, key, status, version FROM idempotency_keys
		WHERE (scope, key) > ($1, $2) AND expires_at > now()
		ORDER BY scope, key LIMIT $3`, after.Scope, after.Key, limit)
	if err != nil {
		return nil, fmt.Errorf("scan keys: %w", err)
	}
	defer rows.Close()
	page := make([]KeyVersion, 0, limit)
	for rows.Next() {
		var k KeyVersion
		if err := rows.Scan(&k.Scope, &k.Key, &k.Status, &k.Version); err != nil {
			return nil, fmt.Errorf("scan keys: %w", err)
		}
		page = append(page, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("scan keys: %w", err)
	}
	return page, nil
}

// Live reports which of refs have a live (unexpired) row.
func (s *Store) Live(ctx context.Context, db DB, refs []Ref) (map[Ref]bool, error) {
	scopes, keys := refColumns(refs)
	rows, err := db.Query(ctx, `SELECT k.scope, k.key FROM unnest($1::text[], $2::text[]) AS r(scope, key)
		JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key WHERE k.expires_at > now()`, scopes, keys)
	if err != nil {
		return nil, fmt.Errorf("look up keys: %w", err)
	}
	defer rows.Close()
	live := make(map[Ref]bool, len(refs))
	for rows.Next() {
		var r Ref
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

// ErrKeyInProgress is returned by Purge for a key whose lease is held,
// unless forced.
var ErrKeyInProgress = errors.New("the key is in progress; purging it lets a duplicate run")

// purgeSQL expires a key now, one version up, with its outbox event: the
// relay deletes the Redis copy, the next claim starts a new lifecycle that
// keeps counting versions (so no stale copy can outrank it), and retention
// deletes the row. A held key (forced) becomes failed, so its worker can no
// longer complete it.
var purgeSQL = transitionSQL(`
	UPDATE idempotency_keys AS k SET version = k.version + 1, expires_at = now(), updated_at = now(),
		status = CASE WHEN k.status = 'in_progress' THEN 'failed' ELSE k.status END,
		owner = NULL, lease_expires_at = NULL
	WHERE k.scope = $1 AND k.key = $2 AND (k.status <> 'in_progress' OR $3)
	RETURNING k.*`, notifyColumn)

// Purge forgets (scope, key): it expires the row at once, through the
// outbox like any transition, so no relay or reconciler can bring the old
// state back. It returns the row as purged (ExpiresIn ≤ 0), false if there
// was no row, or ErrKeyInProgress for a held key unless force.
func (s *Store) Purge(ctx context.Context, db DB, scope, key string, force bool) (Key, bool, error) {
	var notified bool
	k, err := scanKey(db.QueryRow(ctx, purgeSQL, scope, key, force), &notified)
	if err == nil {
		return k, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Key{}, false, fmt.Errorf("purge key: %w", err)
	}
	current, found, err := s.Get(ctx, db, scope, key)
	switch {
	case err != nil:
		return Key{}, false, fmt.Errorf("purge key: %w", err)
	case found && current.Status == StatusInProgress:
		return current, true, ErrKeyInProgress
	}
	return Key{}, false, nil
}
