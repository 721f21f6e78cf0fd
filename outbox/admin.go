package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// Unpark puts the parked outbox events ids back in the relays' queue, their
// attempts counted from zero again, and wakes the relays. It returns how
// many it unparked: events not parked are left alone.
func (s *Store) Unpark(ctx context.Context, db DB, ids []int64) (int, error) {
	var n int
	var notified bool
	err := unparkEventsSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"ids": ids, "channel": NotifyChannel}).Scan(&n, &notified)
	if err != nil {
		return 0, fmt.Errorf("unpark outbox events: %w", err)
	}
	return n, nil
}

// DeletePurged deletes the row of ref if it is past its expiry (purged),
// as retention would on its next pass: first it raises the version floor to
// the row's version, in a statement that commits on its own (db must not be
// a transaction), so the key, created again, starts above every version it
// had. It reports whether it deleted the row; a key claimed again since its
// purge is live and stays.
func (s *Store) DeletePurged(ctx context.Context, db DB, ref keystate.Ref) (bool, error) {
	args := pgx.StrictNamedArgs{"scope": ref.Scope, "key": ref.Key}
	if err := s.raiseFloorForKey(ctx, db, args); err != nil {
		return false, fmt.Errorf("delete purged key: raise the version floor: %w", err)
	}
	tag, err := deleteKeySQL.exec(ctx, db, args)
	if err != nil {
		return false, fmt.Errorf("delete purged key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// raiseFloorForKey raises the version floor to the version of the key args
// name, if it is past its expiry: in one statement on one Postgres
// (raise_version_floor_key), in two on a distributed database (Citus),
// which refuses an update of the floor, a reference table, that reads
// the key's shard.
func (s *Store) raiseFloorForKey(ctx context.Context, db DB, args pgx.StrictNamedArgs) error {
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return err
	}
	if !byScope {
		_, err := raiseVersionFloorKeySQL.exec(ctx, db, args)
		return err
	}
	var version *int64
	if err := purgedVersionSQL.queryRow(ctx, db, args).Scan(&version); err != nil {
		return fmt.Errorf("read the purged key's version: %w", err)
	}
	if version == nil {
		return nil
	}
	_, err = raiseFloorToSQL.exec(ctx, db, pgx.StrictNamedArgs{"version": *version})
	return err
}

// Pass is a reconcile pass as RecordPass records it.
type Pass struct {
	// Result is ok, partial or failed.
	Result string
	// Report is the pass's report as JSON.
	Report []byte
	// Err says why a failed pass failed.
	Err error
	// Duration is how long the pass ran.
	Duration time.Duration
}

// KeptPasses is how many passes RecordPass keeps.
const KeptPasses = 100

// RecordPass records a reconcile pass in reconcile_passes and deletes all
// but the last KeptPasses.
func (s *Store) RecordPass(ctx context.Context, db DB, p Pass) error {
	var errText string
	if p.Err != nil {
		errText = p.Err.Error()
	}
	_, err := recordPassSQL.exec(ctx, db, pgx.StrictNamedArgs{"result": p.Result, "report": string(p.Report), "error": errText, "duration": p.Duration, "keep": KeptPasses})
	if err != nil {
		return fmt.Errorf("record reconcile pass: %w", err)
	}
	return nil
}

// CountStuck counts the keys in progress that started a step and whose
// lease ran out more than grace ago: executions no live engine has resumed.
func (s *Store) CountStuck(ctx context.Context, db DB, grace time.Duration) (int, error) {
	var n int
	if err := countStuckSQL.queryRow(ctx, db, pgx.StrictNamedArgs{"grace": grace}).Scan(&n); err != nil {
		return 0, fmt.Errorf("count stuck executions: %w", err)
	}
	return n, nil
}
