// Package outbox is the Postgres side of onceonly: the idempotency_keys
// table, where every key's state is decided, and the outbox table that
// carries each state change to the Redis cache.
//
// Every transition (claim, complete, fail, reap, purge) is one statement
// that updates the key, bumps its version and writes an outbox event, so it
// commits or rolls back with whatever transaction runs it: completion runs
// inside the caller's business transaction. The statements live whole in
// sql/, one file each.
//
// Their parameters are named (@scope, @lease, …), as pgx.NamedArgs takes
// them, and every call passes its arguments as a pgx.StrictNamedArgs, so an
// argument missing or left over is an error. pgx would find the names and
// number them by lexing the statement's whole text at every call: tens of
// microseconds and some fifty allocations for the longer statements
// (BenchmarkStatementArgs). The package runs that same rewriting once per
// statement, when it loads (sql.go), and at each call only puts the
// arguments in the order it found: what Postgres receives is what
// pgx.StrictNamedArgs would send.
//
// The 14 key columns that every statement returning keys selects first are
// written once, in sql/key_columns.sql, and scanned by one type, keyRow. A
// statement names them {{key_columns}} ({{key_columns @max_body}} to leave
// out long bodies), and the package puts those lines in its place when it
// loads, as sqlc's sqlc.embed does when it generates code: each statement
// still reads whole with one file beside it, and what Postgres receives,
// prepares and plans is the statement written out: nothing is added per
// call, and per row only a few COALESCEs where a statement used to select
// constants (a new claim's empty response). A view or a SQL function in a
// migration would not do: a view cannot apply to the rows a statement's own
// INSERT or UPDATE … RETURNING produces, and a function returning the
// columns would add a function call and a composite value to decode to
// every row of every claim and completion.
//
// The channel the statements notify the relays on is an argument too,
// @channel, always NotifyChannel: its name is written once, in Go, where
// the relays' LISTEN reads it as well.
//
// The statements work in every pgx query mode: the default (named prepared
// statements) and exec and simple_protocol, the modes PgBouncer in
// transaction mode allows (default_query_exec_mode=exec in the URL). Their
// arguments are values all three encode without a described type: an owner
// goes as its uuid text, JSON as a string (a []byte would go as bytea), and
// nothing relies on the session between statements.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceonly/onceonly/keystate"
)

// NotifyChannel is the LISTEN/NOTIFY channel woken by outbox writes. It is
// the name's one definition: the statements that notify take it as their
// @channel argument.
const NotifyChannel = "onceonly_outbox"

// Defaults of Config: how long keys are kept.
const (
	DefaultCompletedTTL = 24 * time.Hour
	DefaultFailedTTL    = 5 * time.Minute
)

// DB is what the store runs statements on: a pool, a connection or a
// transaction (pgx.Tx). The caller owns commit and rollback. Claim and
// Complete take a Querier, which a database/sql transaction is too
// (SQLTx).
type DB interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ErrLeaseLost is returned by Complete, Fail and Heartbeat when the key is no
// longer in progress under the caller's owner token: its lease was taken
// over (or reaped), so the caller must roll back its business writes.
var ErrLeaseLost = errors.New("lease lost: the key is no longer held by this owner")

// Config holds the store's time limits.
type Config struct {
	// CompletedTTL is how long a completed key is kept (DefaultCompletedTTL
	// when zero).
	CompletedTTL time.Duration
	// FailedTTL is how long a failed key is kept (DefaultFailedTTL when
	// zero).
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
	// Distribution is how the tables are laid out (DetectDistribution: the
	// store asks the database, once).
	Distribution Distribution
}

// Store runs the key transitions. It holds no connection: every method
// takes the DB to run on.
type Store struct {
	cfg Config
	// dist is the Distribution in force: DetectDistribution until the
	// store asked the database.
	dist atomic.Int32
	// outboxScopes are the scopes the relay takes events from next, on a
	// distributed database.
	outboxScopes scopeQueue
	// lockSecret is the database's key lock secret, once loaded
	// (LoadLockSecret).
	lockSecret atomic.Pointer[[]byte]
}

// New returns a Store.
func New(cfg Config) *Store {
	if cfg.CompletedTTL <= 0 {
		cfg.CompletedTTL = DefaultCompletedTTL
	}
	if cfg.FailedTTL <= 0 {
		cfg.FailedTTL = DefaultFailedTTL
	}
	s := &Store{cfg: cfg}
	s.dist.Store(int32(cfg.Distribution))
	return s
}

// keyRow is where the key columns (sql/key_columns.sql) of a row are
// scanned to.
type keyRow struct {
	k                  keystate.Key
	owner              [16]byte
	leaseMs, expiresMs int64
	header             string
}

// dest returns the destinations of the key columns, in their order.
func (r *keyRow) dest() []any {
	return []any{&r.k.Scope, &r.k.Key, &r.k.Status, &r.k.Version, &r.k.Fingerprint, &r.owner, &r.leaseMs,
		&r.k.Response.Status, &r.k.Response.ContentType, &r.header, &r.k.Response.Body, &r.k.BodyOmitted, &r.expiresMs,
		&r.k.Failures}
}

// key returns the key scanned.
func (r *keyRow) key() keystate.Key {
	k := r.k
	k.Owner = keystate.Owner(r.owner)
	k.Response.Header = keystate.DecodeHeader(r.header)
	k.LeaseRemaining = time.Duration(r.leaseMs) * time.Millisecond
	k.ExpiresIn = time.Duration(r.expiresMs) * time.Millisecond
	return k
}

// scanKey scans the key columns every key statement selects first, then
// the statement's extra columns into extra.
func scanKey(row pgx.Row, extra ...any) (keystate.Key, error) {
	var r keyRow
	if err := row.Scan(append(r.dest(), extra...)...); err != nil {
		return keystate.Key{}, fmt.Errorf("scan key: %w", err)
	}
	return r.key(), nil
}

// Notify wakes the relays (LISTEN on NotifyChannel). Outside a
// transaction it is cheap: it writes no WAL.
func (s *Store) Notify(ctx context.Context, db DB) error {
	if _, err := notifySQL.exec(ctx, db, pgx.StrictNamedArgs{"channel": NotifyChannel}); err != nil {
		return fmt.Errorf("notify relays: %w", err)
	}
	return nil
}

// ClaimResult is the outcome of Claim.
type ClaimResult struct {
	// Claimed is true when the caller now holds the key's lease.
	Claimed bool
	// Key is the row after the claim, or the row that stopped it.
	Key keystate.Key
	// Steps holds the recovery points of an execution this claim took over
	// (see RecordStep): a JSON object by step name, or nil.
	Steps []byte
	// TookOver is true when the claim took over an execution whose lease
	// ran out (its holder died or handed it off), rather than a key with
	// no row, a failed one or an expired one.
	TookOver bool
}

// maxClaimRounds bounds how often Claim retries a row that keeps changing
// under it (taken over or deleted between its reads).
const maxClaimRounds = 16

// Claim takes the lease of (scope, key) for owner, or reports the row that
// holds it. A row in progress under owner itself (an earlier try of this
// claim committed, and its answer was lost) is the claim: it comes back
// Claimed. It tries claim_insert; on a row it reads it (claim_peek) and,
// if the row is takeable (failed, lease run out, or expired), takes it over
// (claim_takeover). Only a row that changes between those statements sends
// it round again.
//
// Both writes take the key's lock first, as every execution does. When
// another transaction holds it, an execution of the key is under way: the
// row, if it says more (completed, a reused key, a live lease), comes back
// to answer from, else the claim fails with ErrKeyBusy. In a caller's
// transaction (db a transaction) the failed statement aborts it, so no row
// is read: ErrKeyBusy, and the caller rolls back to its savepoint.
//
// Finding a row that cannot be taken (a replay, a conflict, a reused key)
// costs two reads and no lock or write, so answers from Postgres scale like
// reads. When db is not a transaction, a successful claim commits without
// waiting for its WAL flush (synchronous_commit off for that commit): a
// claim lost in a crash was acted on by nobody, since the completion or
// failure that follows it flushes it first, and a duplicate it turned away
// retries.
func (s *Store) Claim(ctx context.Context, db Querier, ref keystate.Ref, fingerprint string, owner keystate.Owner, lease time.Duration) (ClaimResult, error) {
	return s.claim(ctx, db, ref, fingerprint, owner, lease, true)
}

// ClaimHeld is Claim for a key that ClaimNew found a row for: it starts
// by reading that row.
func (s *Store) ClaimHeld(ctx context.Context, db Querier, ref keystate.Ref, fingerprint string, owner keystate.Owner, lease time.Duration) (ClaimResult, error) {
	return s.claim(ctx, db, ref, fingerprint, owner, lease, false)
}

// claim is Claim; insert false skips its first insert.
func (s *Store) claim(ctx context.Context, db Querier, ref keystate.Ref, fingerprint string, owner keystate.Owner, lease time.Duration, insert bool) (ClaimResult, error) {
	if err := s.LoadLockSecret(ctx, db); err != nil {
		return ClaimResult{}, fmt.Errorf("claim key: %w", err)
	}
	inTx := inTransaction(db)
	args := pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "lock_id": s.LockID(ref), "fingerprint": fingerprint,
		"owner": owner.String(), "lease": lease, "ttl": s.cfg.CompletedTTL, "notify": !s.cfg.DeferNotify,
		"channel": NotifyChannel, "async_commit": !inTx}
	insertSQL, takeoverSQL := s.forLayout(claimInsertSQL), s.forLayout(claimTakeoverSQL)
	peekArgs := pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "fingerprint": fingerprint}
	var notified bool
	var durability string
	var steps []byte
	for range maxClaimRounds {
		var k keystate.Key
		var err error
		if insert {
			k, err = scanKey(insertSQL.queryRow(ctx, db, args), &notified, &durability, &steps)
			switch {
			case err == nil:
				return ClaimResult{Claimed: true, Key: k}, nil
			case sqlState(err) == keyBusy:
				return s.claimBusy(ctx, db, inTx, peekArgs, err)
			case !errors.Is(err, pgx.ErrNoRows):
				return ClaimResult{}, fmt.Errorf("claim key: %w", err)
			}
		}
		insert = true
		var takeable, live bool
		k, err = scanKey(claimPeekSQL.queryRow(ctx, db, peekArgs), &takeable, &steps, &live)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted by retention since: insert again
		case err != nil:
			return ClaimResult{}, fmt.Errorf("claim key: %w", err)
		case k.Status == keystate.InProgress && k.Owner == owner:
			// This owner's own claim, committed by an earlier try whose
			// answer was lost (a connection that died after the commit, a
			// batch that failed after it): it holds the key.
			return ClaimResult{Claimed: true, Key: k, Steps: steps}, nil
		case !takeable:
			return ClaimResult{Key: k}, nil
		}
		inProgress := k.Status == keystate.InProgress
		takeArgs := maps.Clone(args)
		takeArgs["live"], takeArgs["in_progress"] = live, inProgress
		k, err = scanKey(takeoverSQL.queryRow(ctx, db, takeArgs), &notified, &durability, &steps)
		switch {
		case err == nil:
			return ClaimResult{Claimed: true, Key: k, Steps: steps, TookOver: inProgress && live}, nil
		case sqlState(err) == keyBusy:
			return s.claimBusy(ctx, db, inTx, peekArgs, err)
		case !errors.Is(err, pgx.ErrNoRows):
			return ClaimResult{}, fmt.Errorf("claim key: %w", err)
		}
		// Another claim took it first, retention deleted it, or it expired
		// since the peek: look again.
	}
	return ClaimResult{}, fmt.Errorf("claim key: the row changed under %d attempts in a row", maxClaimRounds)
}

// claimBusy is the end of a claim whose key's lock another transaction
// holds (err, SQLSTATE OO002): the key's row when it answers the request
// whoever holds the lock (completed, a live lease, another fingerprint),
// else ErrKeyBusy. In a transaction (inTx) the failed statement aborted
// it: ErrKeyBusy at once.
func (s *Store) claimBusy(ctx context.Context, db Querier, inTx bool, peekArgs pgx.StrictNamedArgs, err error) (ClaimResult, error) {
	busy := fmt.Errorf("claim key: %w", busyOnState(err))
	if inTx {
		return ClaimResult{}, busy
	}
	var takeable, live bool
	var steps []byte
	k, perr := scanKey(claimPeekSQL.queryRow(ctx, db, peekArgs), &takeable, &steps, &live)
	switch {
	case errors.Is(perr, pgx.ErrNoRows), perr == nil && takeable:
		return ClaimResult{}, busy
	case perr != nil:
		return ClaimResult{}, fmt.Errorf("claim key: %w", perr)
	}
	return ClaimResult{Key: k}, nil
}

// forLayout returns st as the tables' layout needs it: its variant for a
// distributed database (statement.byScope) when the store knows the tables
// are distributed, else st.
func (s *Store) forLayout(st *statement) *statement {
	if st.byScope != nil && Distribution(s.dist.Load()) == ByScope {
		return st.byScope
	}
	return st
}

// ClaimRequest is one key of ClaimNew.
type ClaimRequest struct {
	Ref         keystate.Ref
	Fingerprint string
	Owner       keystate.Owner
}

// ClaimNew claims, in one statement and one commit (not waited for), each
// key of reqs that has no row, under its request's owner. The results come
// in the order of reqs: Claimed with the key's row, or, for a key that has a
// row (or appears twice in reqs), a zero ClaimResult: finish its claim with
// ClaimHeld. A wait longer than lockTimeout for another transaction that
// inserted one of the keys fails the whole statement (SQLSTATE 55P03), so
// that one key does not hold up the others; db must not be a transaction.
func (s *Store) ClaimNew(ctx context.Context, db DB, reqs []ClaimRequest, lease, lockTimeout time.Duration) ([]ClaimResult, error) {
	if _, inTx := db.(pgx.Tx); inTx {
		// Its settings (no flush wait, lock_timeout) would hold for the
		// caller's whole transaction.
		return nil, errors.New("claim keys: ClaimNew runs its own transaction; use Claim inside one")
	}
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("claim keys: %w", err)
	}
	if err := s.LoadLockSecret(ctx, db); err != nil {
		return nil, fmt.Errorf("claim keys: %w", err)
	}
	args := pgx.StrictNamedArgs{"lease": lease, "ttl": s.cfg.CompletedTTL, "notify": !s.cfg.DeferNotify,
		"channel": NotifyChannel, "lock_timeout": fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))}
	claimed := make(map[keystate.Owner]keystate.Key, len(reqs))
	if byScope {
		err = s.claimNewByScope(ctx, db, reqs, args, lockTimeout, claimed)
	} else {
		err = s.claimNewAll(ctx, db, reqs, args, claimed)
	}
	if err != nil {
		return nil, err
	}
	results := make([]ClaimResult, len(reqs))
	for i, r := range reqs {
		if k, ok := claimed[r.Owner]; ok {
			results[i] = ClaimResult{Claimed: true, Key: k}
		}
	}
	return results, nil
}

// claimNewAll is ClaimNew on one Postgres: every key in one statement.
func (s *Store) claimNewAll(ctx context.Context, db DB, reqs []ClaimRequest, args pgx.StrictNamedArgs, claimed map[keystate.Owner]keystate.Key) error {
	s.setBatchArgs(args, reqs)
	rows, err := claimBatchSQL.query(ctx, db, args)
	if err != nil {
		return fmt.Errorf("claim keys: %w", err)
	}
	return scanClaimed(rows, claimed)
}

// setBatchArgs sets claim_batch's per-key arguments of reqs in args.
func (s *Store) setBatchArgs(args pgx.StrictNamedArgs, reqs []ClaimRequest) {
	scopes, keys, fingerprints, owners := make([]string, len(reqs)), make([]string, len(reqs)), make([]string, len(reqs)), make([]string, len(reqs))
	lockIDs := make([]int32, len(reqs))
	for i, r := range reqs {
		scopes[i], keys[i], fingerprints[i], owners[i] = r.Ref.Scope, r.Ref.Key, r.Fingerprint, r.Owner.String()
		lockIDs[i] = s.LockID(r.Ref)
	}
	args["scopes"], args["keys"], args["lock_ids"], args["fingerprints"], args["owners"] = scopes, keys, lockIDs, fingerprints, owners
}

// scanClaimed reads claim_batch's rows into claimed, by owner, and closes
// rows.
func scanClaimed(rows pgx.Rows, claimed map[keystate.Owner]keystate.Key) error {
	defer rows.Close()
	var notified bool
	var durability string
	var steps []byte
	for rows.Next() {
		k, err := scanKey(rows, &notified, &durability, &steps)
		if err != nil {
			return fmt.Errorf("claim keys: %w", err)
		}
		claimed[k.Owner] = k
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("claim keys: %w", err)
	}
	return nil
}

// Get reads the row of ref.
func (s *Store) Get(ctx context.Context, db DB, ref keystate.Ref) (keystate.Key, bool, error) {
	k, err := scanKey(getKeySQL.queryRow(ctx, db, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key}))
	if errors.Is(err, pgx.ErrNoRows) {
		return keystate.Key{}, false, nil
	}
	if err != nil {
		return keystate.Key{}, false, fmt.Errorf("get key: %w", err)
	}
	return k, true, nil
}

// Complete stores resp and marks the key completed, inside the caller's
// transaction: it commits with the business writes or not at all. When
// owner no longer holds the key, the statement fails (rather than changing
// nothing), so the transaction it ran in cannot commit the writes without
// the key, and Complete returns ErrLeaseLost.
func (s *Store) Complete(ctx context.Context, tx Querier, ref keystate.Ref, owner keystate.Owner, resp keystate.Response) (keystate.Key, error) {
	var notified bool
	k, err := scanKey(finishSQL.queryRow(ctx, tx, s.completeArgs(ref, owner, resp)), &notified)
	return k, finishError(keystate.Completed, err)
}

// QueueComplete queues on b the completion Complete runs, for a batch that
// sends the transaction's COMMIT behind it in the same round trip: when
// owner no longer holds the key, the statement fails with ErrLeaseLost
// (rather than returning no row), so Postgres skips that COMMIT. The
// completed key is stored in dst as b's results are read.
func (s *Store) QueueComplete(b *pgx.Batch, ref keystate.Ref, owner keystate.Owner, resp keystate.Response, dst *keystate.Key) {
	finishSQL.queue(b, s.completeArgs(ref, owner, resp)).QueryRow(func(row pgx.Row) error {
		var notified bool
		k, err := scanKey(row, &notified)
		if err != nil {
			return finishError(keystate.Completed, err)
		}
		*dst = k
		return nil
	})
}

// completeArgs are the arguments of finish.sql for a completion, which
// fails when owner no longer holds the key.
func (s *Store) completeArgs(ref keystate.Ref, owner keystate.Owner, resp keystate.Response) pgx.StrictNamedArgs {
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "owner": owner.String(), "status": keystate.Completed,
		"response_status": resp.Status, "response_content_type": resp.ContentType, "response_body": body,
		"response_headers": keystate.EncodeHeader(resp.Header), "ttl": s.cfg.CompletedTTL,
		"notify": !s.cfg.DeferNotify, "channel": NotifyChannel, "fail_when_lost": true, "count_failure": false}
}

// Fail marks the key failed (retryable: the next request claims it again).
// countFailure adds one to the key's failures: set it when the handler
// failed, not when the store or the caller ended the execution. It returns
// ErrLeaseLost when owner no longer holds the key.
func (s *Store) Fail(ctx context.Context, db DB, ref keystate.Ref, owner keystate.Owner, countFailure bool) (keystate.Key, error) {
	var notified bool
	k, err := scanKey(finishSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key,
		"owner": owner.String(), "status": keystate.Failed,
		"response_status": nil, "response_content_type": nil, "response_body": nil, "response_headers": nil,
		"ttl": s.cfg.FailedTTL, "notify": !s.cfg.DeferNotify, "channel": NotifyChannel, "fail_when_lost": false,
		"count_failure": countFailure}), &notified)
	return k, finishError(keystate.Failed, err)
}

// finishError maps the error of finish.sql: no row, or its failure when the
// owner lost the key (SQLSTATE OO001, onceonly_lease_lost), is ErrLeaseLost.
func finishError(status keystate.Status, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows), sqlState(err) == leaseLostCode:
		return ErrLeaseLost
	}
	return fmt.Errorf("mark key %s: %w", status, err)
}

// leaseLostCode is the SQLSTATE of onceonly_lease_lost (migration 00006).
const leaseLostCode = "OO001"

// Heartbeat extends owner's lease to lease from now. A heartbeat is not a
// transition: it bumps no version and writes no event.
func (s *Store) Heartbeat(ctx context.Context, db DB, ref keystate.Ref, owner keystate.Owner, lease time.Duration) error {
	tag, err := heartbeatSQL.exec(ctx, db, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "owner": owner.String(), "lease": lease})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}

// RecordStep records a recovery point of the execution owner holds on ref:
// record is the step's JSON record ({} for an intent, {"outcome": …} once
// the outcome is known). request, when not nil, is stored for a
// resumption, with handler. Outcomes (async) commit without waiting for the
// WAL flush: one lost in a crash costs a repeated call with the same
// downstream key. It returns ErrLeaseLost when owner no longer holds ref.
func (s *Store) RecordStep(ctx context.Context, db DB, ref keystate.Ref, owner keystate.Owner, step string, record []byte,
	handler string, request []byte, async bool,
) error {
	args := pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "owner": owner.String(),
		"step": step, "record": string(record), "handler": handler, "request": request}
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return fmt.Errorf("record step %s: %w", step, err)
	}
	if byScope {
		recorded, err := s.recordStepByScope(ctx, db, args, async)
		switch {
		case err != nil:
			return fmt.Errorf("record step %s: %w", step, err)
		case !recorded:
			return ErrLeaseLost
		}
		return nil
	}
	args["async_commit"] = async
	var durability string
	err = recordStepSQL.queryRow(ctx, db, args).Scan(&durability)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("record step %s: %w", step, err)
	}
	return nil
}

// HandOff ends owner's lease on ref without finishing the execution: its
// lease expires now, one version up, so a client retry or a resumer takes
// it over at once (see hand_off.sql). It returns ErrLeaseLost when owner no
// longer holds ref.
func (s *Store) HandOff(ctx context.Context, db DB, ref keystate.Ref, owner keystate.Owner) (keystate.Key, error) {
	var notified bool
	k, err := scanKey(handOffSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key,
		"owner": owner.String(), "notify": !s.cfg.DeferNotify, "channel": NotifyChannel}), &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return keystate.Key{}, ErrLeaseLost
	}
	if err != nil {
		return keystate.Key{}, fmt.Errorf("hand off key: %w", err)
	}
	return k, nil
}

// Resumable is an execution ResumeClaim took over.
type Resumable struct {
	Key keystate.Key
	// Handler, Request and Steps are what its last holder recorded.
	Handler string
	Request []byte
	Steps   []byte
}

// ResumeClaim takes over up to len(owners) executions of the named
// handlers that started a step and whose lease ran out, each under one of
// owners with a new lease.
func (s *Store) ResumeClaim(ctx context.Context, db DB, handlers []string, owners []keystate.Owner, lease time.Duration) ([]Resumable, error) {
	ids := make([]string, len(owners))
	for i, o := range owners {
		ids[i] = o.String()
	}
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("claim executions to resume: %w", err)
	}
	if byScope {
		return s.resumeByScope(ctx, db, handlers, ids, lease)
	}
	rows, err := resumeClaimSQL.query(ctx, db, pgx.StrictNamedArgs{"lease": lease, "notify": !s.cfg.DeferNotify,
		"channel": NotifyChannel, "handlers": handlers, "limit": len(owners), "owners": ids})
	if err != nil {
		return nil, fmt.Errorf("claim executions to resume: %w", err)
	}
	return scanResumable(rows, nil)
}

// scanResumable appends resume_claim's rows to out and closes rows.
func scanResumable(rows pgx.Rows, out []Resumable) ([]Resumable, error) {
	defer rows.Close()
	for rows.Next() {
		var r Resumable
		var notified bool
		var err error
		if r.Key, err = scanKey(rows, &notified, &r.Handler, &r.Request, &r.Steps); err != nil {
			return out, fmt.Errorf("claim executions to resume: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("claim executions to resume: %w", err)
	}
	return out, nil
}

// Lease is a lease RenewLeases extends.
type Lease struct {
	Ref   keystate.Ref
	Owner keystate.Owner
}

// RenewLeases extends every lease in leases to lease from now, in one
// statement, and returns the owners that still hold theirs; the others were
// taken over or reaped.
func (s *Store) RenewLeases(ctx context.Context, db DB, leases []Lease, lease time.Duration) (map[keystate.Owner]bool, error) {
	n := len(leases)
	held := make(map[keystate.Owner]bool, n)
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	if byScope {
		if err := s.renewByScope(ctx, db, leases, lease, held); err != nil {
			return nil, err
		}
		return held, nil
	}
	scopes, keys, owners := make([]string, n), make([]string, n), make([]string, n)
	for i, l := range leases {
		scopes[i], keys[i], owners[i] = l.Ref.Scope, l.Ref.Key, l.Owner.String()
	}
	rows, err := renewLeasesSQL.query(ctx, db, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys, "owners": owners, "lease": lease})
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	if err := scanHeld(rows, held); err != nil {
		return nil, err
	}
	return held, nil
}

// scanHeld reads renew_leases's rows into held and closes rows.
func scanHeld(rows pgx.Rows, held map[keystate.Owner]bool) error {
	defer rows.Close()
	for rows.Next() {
		var o [16]byte
		if err := rows.Scan(&o); err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		held[o] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	return nil
}
