package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// SingleBegin is what single_begin.sql and single_probe.sql found.
type SingleBegin struct {
	// Locked is true when this transaction holds the key's lock.
	Locked bool
	// HasRow is true when the key has a row: a single commit cannot
	// handle it.
	HasRow bool
	// Floor is the version floor, read with HasRow, for
	// QueueSingleComplete and QueueSinglePromote on a distributed database;
	// on one Postgres their statements read it themselves.
	Floor int64
}

// executionSavepoint is the savepoint a single-commit execution's
// transaction makes before its handler runs: an execution that ends
// without a result rolls back to it and writes the key's failed row while
// it still holds the key's lock (QueueSingleFail).
const executionSavepoint = "onceonly_execution"

// keepalivesSet marks, in a connection's CustomData, a session whose
// keepalives SetKeepalives set.
const keepalivesSet = "onceonly.keepalives"

// SetKeepalives makes the server probe conn's client end for the rest of
// the session (session_keepalives.sql), once per connection: a connection
// that has them already costs nothing. Behind PgBouncer the setting lands
// on whichever server connection runs it, where it is harmless.
func (s *Store) SetKeepalives(ctx context.Context, conn *pgx.Conn) error {
	data := conn.PgConn().CustomData()
	if data[keepalivesSet] != nil {
		return nil
	}
	if _, err := sessionKeepalivesSQL.exec(ctx, conn, nil); err != nil {
		return fmt.Errorf("set keepalives: %w", err)
	}
	data[keepalivesSet] = true
	return nil
}

// QueueSingleBegin queues on b, behind its BEGIN, the opening of a
// single-commit execution of ref: the key's lock and the transaction's
// limits by lease (single_begin.sql), then, once the lock is held, whether
// the key has a row and the version floor (single_probe.sql), then the
// execution's savepoint. dst is set as b's results are read. The lock
// secret must be loaded (PrepareSession). On a distributed database
// (Citus: known once PrepareSession ran) the lock and limits are the
// coordinator's, and the probe runs on the key's shard.
func (s *Store) QueueSingleBegin(b *pgx.Batch, ref keystate.Ref, lease time.Duration, dst *SingleBegin) {
	ms := strconv.FormatInt(max(lease.Milliseconds(), 1), 10)
	singleBeginSQL.queue(b, pgx.StrictNamedArgs{"lock_id": s.LockID(ref), "lease_ms": ms}).QueryRow(func(row pgx.Row) error {
		var ignored [2]string
		return row.Scan(&dst.Locked, &ignored[0], &ignored[1])
	})
	singleProbeSQL.queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key}).QueryRow(func(row pgx.Row) error {
		return row.Scan(&dst.HasRow, &dst.Floor)
	})
	b.Queue("SAVEPOINT " + executionSavepoint)
}

// QueueSingleComplete queues on b the completion of a single-commit
// execution: the key's row, completed with resp, in the execution's
// transaction. When the key has a row by now, the statement fails with
// ErrLeaseLost, so a COMMIT queued behind it is skipped. dst is set as b's
// results are read. floor is SingleBegin.Floor.
//
// On a distributed database the row, its outbox event and the NOTIFY are
// three statements (citus_single_finish), each routed to one node.
func (s *Store) QueueSingleComplete(b *pgx.Batch, ref keystate.Ref, fingerprint string, resp keystate.Response, floor int64, dst *keystate.Key) {
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	if Distribution(s.dist.Load()) == ByScope {
		citusSingleFinishSQL.queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "fingerprint": fingerprint,
			"floor": floor, "response_status": resp.Status, "response_content_type": resp.ContentType,
			"response_body": body, "response_headers": keystate.EncodeHeader(resp.Header), "ttl": s.cfg.CompletedTTL,
			"ttl_ms": s.cfg.CompletedTTL.Milliseconds()}).QueryRow(func(row pgx.Row) error {
			k, err := scanKey(row)
			if err != nil {
				return finishError(keystate.Completed, lostOnConflict(err))
			}
			*dst = k
			return nil
		})
		s.queueEventOf(b, ref, floor+1)
		return
	}
	s.forLayout(singleFinishSQL).queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "status": keystate.Completed,
		"fingerprint": fingerprint, "response_status": resp.Status, "response_content_type": resp.ContentType,
		"response_body": body, "response_headers": keystate.EncodeHeader(resp.Header), "ttl": s.cfg.CompletedTTL,
		"count_failure": false, "fail_when_lost": true, "take_lock": false, "lock_id": s.LockID(ref),
		"notify": !s.cfg.DeferNotify, "channel": NotifyChannel}).QueryRow(func(row pgx.Row) error {
		var notified bool
		k, err := scanKey(row, &notified)
		if err != nil {
			return finishError(keystate.Completed, err)
		}
		*dst = k
		return nil
	})
}

// QueueSingleFail queues on b, in a single-commit execution's transaction
// (which holds the key's lock), the end of an execution that has no
// stored result, for the COMMIT queued behind it: the handler's writes
// rolled back to the execution's savepoint, and the key's row, failed, so
// a request with another payload is refused (I3), a retry runs again, and
// no other execution of the key ran in between; countFailure records it
// as the key's first failure. dst is set, and written true, as b's
// results are read; written stays false when the key has a row already.
func (s *Store) QueueSingleFail(b *pgx.Batch, ref keystate.Ref, fingerprint string, countFailure bool, dst *keystate.Key, written *bool) {
	b.Queue("ROLLBACK TO SAVEPOINT " + executionSavepoint)
	s.forLayout(singleFinishSQL).queue(b, s.failArgs(ref, fingerprint, countFailure, false)).QueryRow(func(row pgx.Row) error {
		return scanFailed(row, dst, written)
	})
}

// SingleFail records a single-commit execution that ended without a
// stored result after its transaction ended otherwise (its connection
// died, its COMMIT's outcome is unknown): the key's row, failed, as
// QueueSingleFail writes it, if the key has no row and its lock is free.
// A lock another transaction holds is another execution of the key, whose
// end decides the key: nothing is written. written is false when nothing
// was.
func (s *Store) SingleFail(ctx context.Context, db DB, ref keystate.Ref, fingerprint string, countFailure bool) (k keystate.Key, written bool, err error) {
	if err := s.LoadLockSecret(ctx, db); err != nil {
		return keystate.Key{}, false, fmt.Errorf("fail key: %w", err)
	}
	args := s.failArgs(ref, fingerprint, countFailure, true)
	err = scanFailed(s.forLayout(singleFinishSQL).queryRow(ctx, db, args), &k, &written)
	return k, written, err
}

// failArgs are single_finish's arguments for a failed row; takeLock makes
// it take the key's lock first.
func (s *Store) failArgs(ref keystate.Ref, fingerprint string, countFailure, takeLock bool) pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key,
		"status": keystate.Failed, "fingerprint": fingerprint,
		"response_status": nil, "response_content_type": nil, "response_body": nil, "response_headers": nil,
		"ttl": s.cfg.FailedTTL, "count_failure": countFailure, "fail_when_lost": false,
		"take_lock": takeLock, "lock_id": s.LockID(ref), "notify": !s.cfg.DeferNotify, "channel": NotifyChannel}
}

// scanFailed reads single_finish's failed row into dst, setting written;
// no row (the key has a row, or its lock is held) leaves written false.
func scanFailed(row pgx.Row, dst *keystate.Key, written *bool) error {
	var notified bool
	k, err := scanKey(row, &notified)
	if err = finishError(keystate.Failed, err); err == ErrLeaseLost { //nolint:errorlint // finishError returns it bare
		return nil
	}
	if err != nil {
		return err
	}
	*dst, *written = k, true
	return nil
}

// QueueSinglePromote queues on b, in a single-commit execution's
// transaction (which holds the key's advisory lock and found no row), the
// claim of ref for owner (claim_insert.sql: in progress, under the lease,
// with its outbox event), for the COMMIT queued behind it: the execution
// goes on two-phase once it commits. The lock is held until the row is
// committed, so no duplicate runs in between (I4). dst is set and claimed
// true as b's results are read; claimed stays false when the key has a row
// by now (a two-phase claim, which takes no advisory lock, inserted it).
// floor is SingleBegin.Floor.
//
// On a distributed database the claim, its outbox event, the NOTIFY and the
// asynchronous commit are statements of their own (citus_claim_insert),
// each routed to one node; a key that has a row by now fails the claim,
// which skips the COMMIT, and b's results end with ErrLeaseLost.
func (s *Store) QueueSinglePromote(b *pgx.Batch, ref keystate.Ref, fingerprint string, owner keystate.Owner, lease time.Duration, floor int64, dst *keystate.Key, claimed *bool) {
	if Distribution(s.dist.Load()) == ByScope {
		b.Queue(setAsyncCommit) // the coordinator's commit, as claim_insert's set_config
		citusClaimInsertSQL.queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "fingerprint": fingerprint,
			"owner": owner.String(), "floor": floor, "lease": lease, "lease_ms": lease.Milliseconds(),
			"ttl": s.cfg.CompletedTTL, "ttl_ms": s.cfg.CompletedTTL.Milliseconds()}).QueryRow(func(row pgx.Row) error {
			k, err := scanKey(row)
			if err != nil {
				if err = lostOnConflict(err); errors.Is(err, ErrLeaseLost) {
					return err
				}
				return fmt.Errorf("claim key: %w", err)
			}
			*dst, *claimed = k, true
			return nil
		})
		s.queueEventOf(b, ref, floor+1)
		return
	}
	s.forLayout(claimInsertSQL).queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "lock_id": s.LockID(ref), "fingerprint": fingerprint,
		"owner": owner.String(), "lease": lease, "ttl": s.cfg.CompletedTTL, "notify": !s.cfg.DeferNotify,
		"channel": NotifyChannel, "async_commit": true}).QueryRow(func(row pgx.Row) error {
		var notified bool
		var durability string
		var steps []byte
		k, err := scanKey(row, &notified, &durability, &steps)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return fmt.Errorf("claim key: %w", err)
		}
		*dst, *claimed = k, true
		return nil
	})
}

// uniqueViolation is the SQLSTATE of a duplicate key.
const uniqueViolation = "23505"

// lostOnConflict returns ErrLeaseLost for err a duplicate key (the key has
// a row by now), else err.
func lostOnConflict(err error) error {
	if sqlState(err) == uniqueViolation {
		return ErrLeaseLost
	}
	return err
}

// queueEventOf queues on b, on a distributed database, the outbox event of
// ref's version (citus_outbox_insert) and, unless deferred, the NOTIFY of
// the relays, on the coordinator where they listen: the statements that
// single_finish and claim_insert hold in their CTE and select list.
func (s *Store) queueEventOf(b *pgx.Batch, ref keystate.Ref, version int64) {
	citusOutboxInsertSQL.queue(b, pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key, "version": version})
	if !s.cfg.DeferNotify {
		notifySQL.queue(b, pgx.StrictNamedArgs{"channel": NotifyChannel})
	}
}
