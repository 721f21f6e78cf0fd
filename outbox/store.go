// Package outbox is the Postgres side of onceonly: the idempotency_keys
// table, where every key's state is decided, and the outbox table that
// carries each state change to the Redis cache.
//
// Every transition (claim, complete, fail, reap) is one statement that
// updates the key, bumps its version, writes an outbox row and (unless
// Config.DeferNotify) sends a NOTIFY, so it commits or rolls back with
// whatever transaction runs it: complete runs inside the caller's business
// transaction.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/defaults"
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
	// DeferNotify leaves the NOTIFY out of the claim, complete and fail
	// statements. A NOTIFY inside a transaction holds a database-wide lock
	// through the commit's WAL flush, so committing transactions that
	// notify run one at a time (on the benchmark machine it cut one-row
	// commits from 9.2k/s to 2.5k/s). Deferred, the caller sends Notify
	// after the commit when a relay must hurry (the engine does when its
	// write-through to Redis failed); otherwise relays find the events on
	// their poll.
	DeferNotify bool
}

// Store runs the key transitions. It holds no connection: every method
// takes the DB to run on.
type Store struct {
	cfg Config
	// claimInTx runs inside a caller's transaction; claimOwnCommit commits
	// on its own without waiting for the WAL flush (see Claim).
	claimInTx, claimOwnCommit claimStatements
	finishStmt                string
}

type claimStatements struct{ insert, takeover string }

// New returns a Store; zero durations take the defaults (24h, 5m).
func New(cfg Config) *Store {
	defaults.Positive(&cfg.CompletedTTL, 24*time.Hour)
	defaults.Positive(&cfg.FailedTTL, 5*time.Minute)
	notify := notifyColumn
	if cfg.DeferNotify {
		notify = "false"
	}
	s := &Store{cfg: cfg, finishStmt: transitionSQL(finishSQL, notify, "''")}
	claim := func(durability string) claimStatements {
		return claimStatements{
			insert:   transitionSQL(insertSQL, notify, durability),
			takeover: transitionSQL(takeoverSQL, notify, durability),
		}
	}
	s.claimInTx, s.claimOwnCommit = claim("''"), claim(asyncCommitColumn)
	return s
}

// transitionSQL makes change, a statement on idempotency_keys k that
// returns the changed rows (RETURNING k.*), a transition: it writes one
// outbox event per changed row and selects the rows as scanKey reads them,
// followed by the extra columns.
func transitionSQL(change string, extra ...string) string {
	return `
WITH changed AS (` + change + `
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM changed
)
SELECT ` + keyColumns + `, ` + strings.Join(extra, ", ") + ` FROM changed k`
}

// notifyColumn is an extra column of the transition statements: it sends
// the NOTIFY that wakes the relays, in the statement's transaction.
const notifyColumn = `pg_notify('` + NotifyChannel + `', '') IS NULL`

// asyncCommitColumn is an extra column of a claim that commits on its own:
// that commit does not wait for its WAL to reach the disk.
const asyncCommitColumn = `set_config('synchronous_commit', 'off', true)`

// Notify wakes the relays (LISTEN onceonly_outbox). Outside a transaction
// it is cheap: it writes no WAL.
func (s *Store) Notify(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `SELECT pg_notify('`+NotifyChannel+`', '')`); err != nil {
		return fmt.Errorf("notify relays: %w", err)
	}
	return nil
}

// ClaimResult is the outcome of Claim.
type ClaimResult struct {
	// Claimed is true when the caller now holds the key's lease.
	Claimed bool
	// Key is the row after the claim, or the row that stopped it.
	Key Key
}

// insertSQL claims a key that has no row.
const insertSQL = `
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
	VALUES ($1, $2, 'in_progress', 1, $3, $4, now() + $5::interval, now() + $6::interval)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*`

// takeableSQL is true for a row a claim with fingerprint $3 may take over:
// it failed, or its lease ran out, or the row is past its expiry (then any
// fingerprint starts a new lifecycle, which keeps counting versions).
const takeableSQL = `(k.expires_at <= now()
	OR (k.fingerprint = $3 AND (k.status = 'failed' OR (k.status = 'in_progress' AND k.lease_expires_at <= now()))))`

// takeoverSQL claims a takeable row.
const takeoverSQL = `
	UPDATE idempotency_keys AS k SET
		status = 'in_progress', version = k.version + 1, fingerprint = $3,
		owner = $4, lease_expires_at = now() + $5::interval,
		expires_at = now() + $6::interval, updated_at = now(),
		response_status = NULL, response_content_type = NULL, response_body = NULL
	WHERE k.scope = $1 AND k.key = $2 AND ` + takeableSQL + `
	RETURNING k.*`

// peekSQL reads a row a claim found, and whether the claim may take it over.
var peekSQL = `SELECT ` + keyColumns + `, ` + takeableSQL + `
	FROM idempotency_keys k WHERE k.scope = $1 AND k.key = $2`

// maxClaimRounds bounds how often Claim retries a row that keeps changing
// under it.
const maxClaimRounds = 16

// Claim takes the lease of (scope, key) for owner, or reports the row that
// holds it. An in_progress key stays so for lease, then it may be taken
// over; its row expires after CompletedTTL unless completed or failed first.
//
// Finding a row that cannot be taken (a replay, a conflict, a reused key)
// costs two reads and no lock or write, so answers from Postgres scale like
// reads. When db is not a transaction, a successful claim commits without
// waiting for its WAL flush (synchronous_commit off for that commit): a
// claim lost in a crash was acted on by nobody, since the completion or
// failure that follows it flushes it first, and a duplicate it turned away
// retries.
func (s *Store) Claim(ctx context.Context, db DB, scope, key, fingerprint string, owner [16]byte, lease time.Duration) (ClaimResult, error) {
	st := s.claimOwnCommit
	if _, inTx := db.(pgx.Tx); inTx {
		st = s.claimInTx
	}
	args := []any{scope, key, fingerprint, owner, lease, s.cfg.CompletedTTL}
	var notified bool
	var durability string
	for range maxClaimRounds {
		k, err := scanKey(db.QueryRow(ctx, st.insert, args...), &notified, &durability)
		if err == nil {
			return ClaimResult{Claimed: true, Key: k}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ClaimResult{}, fmt.Errorf("claim key: %w", err)
		}
		var takeable bool
		k, err = scanKey(db.QueryRow(ctx, peekSQL, scope, key, fingerprint), &takeable)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted by retention since: insert again
		case err != nil:
			return ClaimResult{}, fmt.Errorf("claim key: %w", err)
		case !takeable:
			return ClaimResult{Key: k}, nil
		}
		k, err = scanKey(db.QueryRow(ctx, st.takeover, args...), &notified, &durability)
		if err == nil {
			return ClaimResult{Claimed: true, Key: k}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ClaimResult{}, fmt.Errorf("claim key: %w", err)
		}
		// Another claim took it first, or retention deleted it: look again.
	}
	return ClaimResult{}, fmt.Errorf("claim key: the row changed under %d attempts in a row", maxClaimRounds)
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
const finishSQL = `
	UPDATE idempotency_keys AS k SET
		status = $4, version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		response_status = $5, response_content_type = $6, response_body = $7,
		expires_at = now() + $8::interval, updated_at = now()
	WHERE k.scope = $1 AND k.key = $2 AND k.owner = $3 AND k.status = 'in_progress'
	RETURNING k.*`

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
	var durability string
	k, err := scanKey(db.QueryRow(ctx, s.finishStmt, scope, key, owner, status, respStatus, contentType, body, ttl), &notified, &durability)
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
