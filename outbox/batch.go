package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// BatchOpen is what batch_begin.sql and batch_probe.sql found for the keys
// of a batch.
type BatchOpen struct {
	// Locked says, for each key in the order given, whether the batch's
	// transaction holds its lock.
	Locked []bool
	// Rows holds the rows the keys have (of locked keys and others alike).
	Rows map[keystate.Ref]keystate.Key
}

// SortByLock sorts refs in the order a batch takes their locks: by lock
// id, then by scope and key (two refs may share an id). Two batches that
// meet on keys try them in one order. The lock secret must be loaded.
func (s *Store) SortByLock(refs []keystate.Ref) {
	ids := make(map[keystate.Ref]int32, len(refs))
	for _, r := range refs {
		ids[r] = s.LockID(r)
	}
	slices.SortFunc(refs, func(a, b keystate.Ref) int {
		switch {
		case ids[a] != ids[b]:
			return int(int64(ids[a]) - int64(ids[b]))
		case a.Scope != b.Scope:
			if a.Scope < b.Scope {
				return -1
			}
			return 1
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
}

// QueueBatchBegin queues on b, behind its BEGIN, the opening of a batch of
// refs (distinct, in lock order: SortByLock): every key's lock, tried
// without waiting, and the transaction's limits by lease
// (batch_begin.sql); then, once the locks are held, the rows the keys have
// (batch_probe.sql). dst is set as b's results are read. The lock secret
// must be loaded. A distributed database runs no batches.
func (s *Store) QueueBatchBegin(b *pgx.Batch, refs []keystate.Ref, lease time.Duration, dst *BatchOpen) {
	ids := make([]int32, len(refs))
	scopes, keys := make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		ids[i], scopes[i], keys[i] = s.LockID(r), r.Scope, r.Key
	}
	ms := strconv.FormatInt(max(lease.Milliseconds(), 1), 10)
	batchBeginSQL.queue(b, pgx.StrictNamedArgs{"lock_ids": ids, "lease_ms": ms}).QueryRow(func(row pgx.Row) error {
		var ignored [2]string
		if err := row.Scan(&dst.Locked, &ignored[0], &ignored[1]); err != nil {
			return fmt.Errorf("lock batch keys: %w", err)
		}
		return nil
	})
	batchProbeSQL.queue(b, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys}).Query(func(rows pgx.Rows) error {
		dst.Rows = map[keystate.Ref]keystate.Key{}
		for rows.Next() {
			k, err := scanKey(rows)
			if err != nil {
				return fmt.Errorf("read batch keys: %w", err)
			}
			dst.Rows[k.Ref] = k
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read batch keys: %w", err)
		}
		return nil
	})
}

// BatchEnd is how one execution of a batch ended.
type BatchEnd struct {
	Ref         keystate.Ref
	Fingerprint string
	// Completed is true for a stored response (Response); false for a
	// failed key, counted among its failures when CountFailure.
	Completed    bool
	Response     keystate.Response
	CountFailure bool
}

// QueueBatchFinish queues on b, in a batch's transaction (which holds
// every key's lock and found no row for any), the rows of ends — completed
// or failed, each with its outbox event — in one statement
// (batch_finish.sql), for the COMMIT queued behind it. When a key has a
// row by now the statement fails (ErrLeaseLost), so the COMMIT is
// skipped. dst is set, by ref, as b's results are read.
func (s *Store) QueueBatchFinish(b *pgx.Batch, ends []BatchEnd, dst map[keystate.Ref]keystate.Key) {
	n := len(ends)
	scopes, keys, statuses, fps := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	codes, types, bodies, headers := make([]*int32, n), make([]*string, n), make([][]byte, n), make([]*string, n)
	failures := make([]int32, n)
	for i, e := range ends {
		scopes[i], keys[i], fps[i] = e.Ref.Scope, e.Ref.Key, e.Fingerprint
		if !e.Completed {
			statuses[i] = string(keystate.Failed)
			if e.CountFailure {
				failures[i] = 1
			}
			continue
		}
		statuses[i] = string(keystate.Completed)
		code, ct, h := int32(e.Response.Status), e.Response.ContentType, keystate.EncodeHeader(e.Response.Header) //nolint:gosec // an HTTP status
		codes[i], types[i], headers[i] = &code, &ct, &h
		bodies[i] = e.Response.Body
		if bodies[i] == nil {
			bodies[i] = []byte{}
		}
	}
	batchFinishSQL.queue(b, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys, "statuses": statuses, "fingerprints": fps,
		"response_statuses": codes, "response_content_types": types, "response_bodies": bodies, "response_headers": headers,
		"failures": failures, "completed_ttl": s.cfg.CompletedTTL, "failed_ttl": s.cfg.FailedTTL,
		"notify": !s.cfg.DeferNotify, "channel": NotifyChannel}).Query(func(rows pgx.Rows) error {
		var notified bool
		for rows.Next() {
			k, err := scanKey(rows, &notified)
			if err != nil {
				return fmt.Errorf("finish batch: %w", err)
			}
			dst[k.Ref] = k
		}
		if err := rows.Err(); err != nil {
			if sqlState(err) == leaseLostCode {
				return fmt.Errorf("finish batch: %w", ErrLeaseLost)
			}
			return fmt.Errorf("finish batch: %w", err)
		}
		return nil
	})
}

// errBatchDistributed is what a batch on a distributed database gets.
var errBatchDistributed = errors.New("batches need one Postgres: a distributed database runs each execution alone")

// CanBatch returns nil when the database runs batches: one Postgres, not
// a distributed one.
func (s *Store) CanBatch() error {
	if Distribution(s.dist.Load()) == ByScope {
		return errBatchDistributed
	}
	return nil
}
