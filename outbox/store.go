// Package outbox is the Postgres side of onceonly: the idempotency_keys
// table, where every key's state is decided, and the outbox table that
// carries each state change to the Redis cache.
//
// Every transition (claim, complete, fail, reap) is one statement that
// updates the key, bumps its version, writes an outbox row and sends a
// NOTIFY, so it commits or rolls back with whatever transaction runs it:
// complete runs inside the caller's business transaction.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceonly/onceonly/cache"
)

// NotifyChannel is the LISTEN/NOTIFY channel woken by every outbox write.
const NotifyChannel = "onceonly_outbox"

// DB is what the store runs statements on: a pool, a connection or a
// transaction (pgx.Tx). The caller owns commit and rollback.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Status is the state of an idempotency key.
type Status string

// The states of an idempotency key.
const (
	StatusInProgress Status = "in_progress"
	StatusCompleted  Status = "completed"
	StatusFailed     Status = "failed"
)

// ErrLeaseLost is returned by Complete, Fail and Heartbeat when the key is no
// longer in progress under the caller's owner token: its lease was taken
// over (or reaped), so the caller must roll back its business writes.
var ErrLeaseLost = errors.New("lease lost: the key is no longer held by this owner")

// Response is a stored response.
type Response struct {
	Status      int
	ContentType string
	Body        []byte
}

// Key is a row of idempotency_keys. Durations are measured by Postgres
// (now()) when the row was read.
type Key struct {
	Scope, Key  string
	Status      Status
	Version     int64
	Fingerprint string
	// Owner and LeaseRemaining are set while the key is in progress.
	Owner          [16]byte
	LeaseRemaining time.Duration
	// Response is set once the key is completed. BodyOmitted means the
	// reader skipped a body larger than the cache keeps (Response.Body is
	// nil then).
	Response    Response
	BodyOmitted bool
	// ExpiresIn is the time left until the row may be deleted.
	ExpiresIn time.Duration
}

// keyColumns is the projection scanned by scanKey, over a row aliased k.
var keyColumns = projection(`k.response_body`, `false`)

// projection returns the columns scanned by scanKey, with body and
// bodyOmitted as the expressions of the response body and of whether it was
// left out.
func projection(body, bodyOmitted string) string {
	return `k.scope, k.key, k.status, k.version, k.fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid),
	coalesce((extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint, 0),
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), ` + body + `, ` + bodyOmitted + `,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint`
}

func scanKey(row pgx.Row, extra ...any) (Key, error) {
	var k Key
	var leaseMs, expiresMs int64
	dest := append([]any{&k.Scope, &k.Key, &k.Status, &k.Version, &k.Fingerprint, &k.Owner,
		&leaseMs, &k.Response.Status, &k.Response.ContentType, &k.Response.Body, &k.BodyOmitted, &expiresMs}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Key{}, err
	}
	k.LeaseRemaining = time.Duration(leaseMs) * time.Millisecond
	k.ExpiresIn = time.Duration(expiresMs) * time.Millisecond
	return k, nil
}

// Config holds the store's time limits.
type Config struct {
	// CompletedTTL is how long a completed key is kept (COMPLETED_TTL).
	CompletedTTL time.Duration
	// FailedTTL is how long a failed key is kept (FAILED_TTL).
	FailedTTL time.Duration
}

// Store runs the key transitions. It holds no connection: every method
// takes the DB to run on.
type Store struct {
	cfg Config
}

// New returns a Store; zero durations take the defaults (24h, 5m).
func New(cfg Config) *Store {
	if cfg.CompletedTTL <= 0 {
		cfg.CompletedTTL = 24 * time.Hour
	}
	if cfg.FailedTTL <= 0 {
		cfg.FailedTTL = 5 * time.Minute
	}
	return &Store{cfg: cfg}
}

// ClaimResult is the outcome of Claim.
type ClaimResult struct {
	// Claimed is true when the caller now holds the key's lease.
	Claimed bool
	// Key is the row after the claim, or the row that stopped it.
	Key Key
}

// claimSQL inserts the key, or takes it over when it failed, its lease ran
// out, or the row is past its expiry (a new lifecycle that keeps counting
// versions). A takeover needs the same fingerprint unless the row expired.
var claimSQL = `
WITH claimed AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
	VALUES ($1, $2, 'in_progress', 1, $3, $4, now() + $5::interval, now() + $6::interval)
	ON CONFLICT (scope, key) DO UPDATE SET
		status = 'in_progress', version = k.version + 1, fingerprint = excluded.fingerprint,
		owner = excluded.owner, lease_expires_at = excluded.lease_expires_at,
		expires_at = excluded.expires_at, updated_at = now(),
		response_status = NULL, response_content_type = NULL, response_body = NULL
	WHERE k.expires_at <= now()
	   OR (k.fingerprint = excluded.fingerprint
	       AND (k.status = 'failed' OR (k.status = 'in_progress' AND k.lease_expires_at <= now())))
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT ` + keyColumns + `, pg_notify('` + NotifyChannel + `', '') IS NULL FROM claimed k`

// Claim takes the lease of (scope, key) for owner, or reports the row that
// holds it. An in_progress key stays so for lease, then it may be taken
// over; its row expires after CompletedTTL unless completed or failed first.
func (s *Store) Claim(ctx context.Context, db DB, scope, key, fingerprint string, owner [16]byte, lease time.Duration) (ClaimResult, error) {
	var notified bool
	k, err := scanKey(db.QueryRow(ctx, claimSQL, scope, key, fingerprint, owner, lease, s.cfg.CompletedTTL), &notified)
	if err == nil {
		return ClaimResult{Claimed: true, Key: k}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return ClaimResult{}, fmt.Errorf("claim key: %w", err)
	}
	// Someone else holds the key. The row may vanish before we read it
	// (retention); then the claim is simply tried again.
	k, found, err := s.Get(ctx, db, scope, key)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim key: %w", err)
	}
	if !found {
		return s.Claim(ctx, db, scope, key, fingerprint, owner, lease)
	}
	return ClaimResult{Key: k}, nil
}

// Get reads the row of (scope, key).
func (s *Store) Get(ctx context.Context, db DB, scope, key string) (Key, bool, error) {
	k, err := scanKey(db.QueryRow(ctx, `SELECT `+keyColumns+` FROM idempotency_keys k WHERE scope = $1 AND key = $2`, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, false, nil
	}
	if err != nil {
		return Key{}, false, fmt.Errorf("get key: %w", err)
	}
	return k, true, nil
}

// finishSQL moves an in_progress key held by owner ($3) to a final status.
var finishSQL = `
WITH done AS (
	UPDATE idempotency_keys AS k SET
		status = $4, version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		response_status = $5, response_content_type = $6, response_body = $7,
		expires_at = now() + $8::interval, updated_at = now()
	WHERE k.scope = $1 AND k.key = $2 AND k.owner = $3 AND k.status = 'in_progress'
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM done
)
SELECT ` + keyColumns + `, pg_notify('` + NotifyChannel + `', '') IS NULL FROM done k`

// Complete stores resp and marks the key completed, inside the caller's
// transaction: it commits with the business writes or not at all. It
// returns ErrLeaseLost when owner no longer holds the key.
func (s *Store) Complete(ctx context.Context, tx DB, scope, key string, owner [16]byte, resp Response) (Key, error) {
	ct := &resp.ContentType
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return s.finish(ctx, tx, scope, key, owner, StatusCompleted, &resp.Status, ct, body, s.cfg.CompletedTTL)
}

// Fail marks the key failed (retryable: the next request claims it again).
// It returns ErrLeaseLost when owner no longer holds the key.
func (s *Store) Fail(ctx context.Context, db DB, scope, key string, owner [16]byte) (Key, error) {
	return s.finish(ctx, db, scope, key, owner, StatusFailed, nil, nil, nil, s.cfg.FailedTTL)
}

func (s *Store) finish(ctx context.Context, db DB, scope, key string, owner [16]byte, status Status,
	respStatus *int, contentType *string, body []byte, ttl time.Duration,
) (Key, error) {
	var notified bool
	k, err := scanKey(db.QueryRow(ctx, finishSQL, scope, key, owner, status, respStatus, contentType, body, ttl), &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrLeaseLost
	}
	if err != nil {
		return Key{}, fmt.Errorf("mark key %s: %w", status, err)
	}
	return k, nil
}

// Heartbeat extends owner's lease to lease from now. A heartbeat is not a
// transition: it bumps no version and writes no event.
func (s *Store) Heartbeat(ctx context.Context, db DB, scope, key string, owner [16]byte, lease time.Duration) error {
	tag, err := db.Exec(ctx, `UPDATE idempotency_keys SET lease_expires_at = now() + $4::interval
		WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 'in_progress'`, scope, key, owner, lease)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}

// CacheUpdate returns the cache update that mirrors the row.
func (k Key) CacheUpdate() cache.Update {
	return cache.Update{
		Scope: k.Scope, Key: k.Key, Version: k.Version,
		State: cache.State(k.Status), Fingerprint: k.Fingerprint, TTL: k.ExpiresIn,
		Owner: k.Owner, LeaseRemaining: k.LeaseRemaining,
		Response:    cache.Response{Status: k.Response.Status, ContentType: k.Response.ContentType, Body: k.Response.Body},
		BodyOmitted: k.BodyOmitted,
	}
}
