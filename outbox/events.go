package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// Event is one outbox row: the key (Scope, Key) reached Version.
type Event struct {
	ID         int64
	Scope, Key string
	Version    int64
	// CreatedAt is when the transition was written (Postgres clock).
	CreatedAt time.Time
	// Attempts counts earlier deliveries that failed.
	Attempts int
}

// refColumns splits refs into the two arrays a query unnests.
func refColumns(refs []keystate.Ref) (scopes, keys []string) {
	scopes, keys = make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		scopes[i], keys[i] = r.Scope, r.Key
	}
	return scopes, keys
}

// Ref returns the key the event is about.
func (e Event) Ref() keystate.Ref { return keystate.Ref{Scope: e.Scope, Key: e.Key} }

// BatchSender sends a pgx.Batch: a *pgxpool.Pool, a *pgxpool.Conn or a
// *pgx.Conn.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// BatchDB is a DB that sends batches: a *pgxpool.Pool, a *pgxpool.Conn or
// a *pgx.Conn.
type BatchDB interface {
	DB
	BatchSender
}

// Batch is what TakeBatch took.
type Batch struct {
	// Events are the events taken, ordered by id.
	Events []Event
	// Updates holds one state per key the events name, in no particular
	// order: its current row, or keystate.Gone at the highest version its
	// events carry when the row is gone.
	Updates []keystate.Key
}

// TakeBatch begins a transaction on db and, in the same round trip, takes up
// to limit unparked events, oldest first, skipping rows other transactions hold, with the current row of every
// key they name read in the same statement (bodies longer than maxBody bytes
// are left out: Key.BodyOmitted). It returns the transaction holding the
// deletes: the caller commits it only once Redis acknowledged the updates
// (I9), or rolls it back, which puts the events back for any relay. The
// commit does not wait for its WAL flush: a deletion lost in a crash
// delivers the events again, which the versioned apply makes harmless (I8).
// When it takes no event it ends the transaction and returns a nil tx; on
// an error no transaction is left open either.
//
// On a distributed database (Citus) it takes the events of one scope, on
// that scope's shard (see takeByScope): every event of a batch then has
// the same scope.
func (s *Store) TakeBatch(ctx context.Context, db BatchDB, limit, maxBody int) (pgx.Tx, Batch, error) {
	byScope, err := s.byScope(ctx, db)
	if err != nil {
		return nil, Batch{}, fmt.Errorf("take outbox events: %w", err)
	}
	if byScope {
		return s.takeByScope(ctx, db, limit, maxBody)
	}
	return s.take(ctx, db, takeBatchSQL, pgx.StrictNamedArgs{"limit": limit, "max_body": maxBody}, limit)
}

// take runs TakeBatch's statement st with args (take_batch, or its variant
// for one scope), behind the BEGIN of its transaction and the settings
// (SET LOCAL) given.
func (s *Store) take(ctx context.Context, db BatchSender, st *statement, args pgx.StrictNamedArgs, limit int, settings ...string) (pgx.Tx, Batch, error) {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	if len(settings) > 0 {
		b.Queue(setPropagateLocal)
		for _, set := range settings {
			b.Queue(set)
		}
	}
	var batch Batch
	st.queue(&b, args).Query(func(rows pgx.Rows) error {
		var err error
		batch, err = scanBatch(rows, limit)
		return err
	})
	br := db.SendBatch(ctx, &b)
	err := br.Close()
	tx := br.Tx()
	if err != nil {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // the error below says it all
		}
		return nil, Batch{}, fmt.Errorf("take outbox events: %w", err)
	}
	if len(batch.Events) == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return nil, Batch{}, fmt.Errorf("end empty take: %w", err)
		}
		return nil, Batch{}, nil
	}
	return tx, batch, nil
}

// scanBatch reads take_batch's rows: an event each, with its key's row.
// Every row of a key carries the same state (one snapshot); the first one
// read is kept. It scans the key columns, then the event's, into one set of
// variables for the whole batch: a drain reads hundreds of thousands of
// rows, and a destination slice and escaping variables per row were a
// quarter of the relay's allocations. The key's scope and key, the event's
// when the key was found, are read once, as the event's.
func scanBatch(rows pgx.Rows, limit int) (Batch, error) {
	size := min(max(limit, 0), 4096) // room for a full batch of a sane size
	b := Batch{Events: make([]Event, 0, size)}
	index := make(map[keystate.Ref]int, size)
	var (
		k     keyRow
		found bool
		e     Event
	)
	dest := append(k.dest(), &found, &e.ID, &e.Scope, &e.Key, &e.Version, &e.CreatedAt, &e.Attempts)
	dest[0], dest[1] = nil, nil // the key's scope and key: skipped
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return Batch{}, fmt.Errorf("scan event: %w", err)
		}
		b.Events = append(b.Events, e)
		i, seen := index[e.Ref()]
		switch {
		case !seen && found:
			index[e.Ref()] = len(b.Updates)
			k.k.Ref = e.Ref()
			b.Updates = append(b.Updates, k.key())
		case !seen:
			index[e.Ref()] = len(b.Updates)
			b.Updates = append(b.Updates, keystate.Gone(e.Ref(), e.Version))
		case !found:
			b.Updates[i].Version = max(b.Updates[i].Version, e.Version)
		}
	}
	if err := rows.Err(); err != nil {
		return Batch{}, fmt.Errorf("read events: %w", err)
	}
	slices.SortFunc(b.Events, func(a, b Event) int { return cmp.Compare(a.ID, b.ID) })
	return b, nil
}

// CurrentKeys reads the current row of every key in refs. Bodies longer
// than maxBody bytes are not read (Key.BodyOmitted). A key missing from the
// result is gone from Postgres.
func (s *Store) CurrentKeys(ctx context.Context, db DB, refs []keystate.Ref, maxBody int) (map[keystate.Ref]keystate.Key, error) {
	scopes, keys := refColumns(refs)
	rows, err := currentKeysSQL.query(ctx, db, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys, "max_body": maxBody})
	if err != nil {
		return nil, fmt.Errorf("read current keys: %w", err)
	}
	defer rows.Close()
	current := make(map[keystate.Ref]keystate.Key, len(refs))
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("read current keys: %w", err)
		}
		current[k.Ref] = k
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read current keys: %w", err)
	}
	return current, nil
}

// FailedEvent is an event whose delivery failed, with the reason.
type FailedEvent struct {
	Event
	Err error
	// Unavailable is true when Redis could not serve the event's key (a
	// node down, a slot moving): it goes back without counting an attempt,
	// since nothing is wrong with the event.
	Unavailable bool
}

// Requeue writes back events taken by TakeBatch that could not be
// delivered, behind everything pending so they never block the rest, with
// one attempt more unless Redis was unavailable. An event that reaches
// maxAttempts is parked: the relay no longer takes it, and last_error says
// why. It returns how many it parked.
func (s *Store) Requeue(ctx context.Context, db DB, failed []FailedEvent, maxAttempts int) (parked int, err error) {
	if len(failed) == 0 {
		return 0, nil
	}
	n := len(failed)
	scopes, keys, errs := make([]string, n), make([]string, n), make([]string, n)
	versions, attempts := make([]int64, n), make([]int, n)
	created := make([]time.Time, n)
	for i, f := range failed {
		scopes[i], keys[i], versions[i], created[i] = f.Scope, f.Key, f.Version, f.CreatedAt
		attempts[i] = f.Attempts
		if !f.Unavailable {
			attempts[i]++
		}
		errs[i] = f.Err.Error()
		if attempts[i] >= maxAttempts {
			parked++
		}
	}
	_, err = requeueEventsSQL.exec(ctx, db, pgx.StrictNamedArgs{"scopes": scopes, "keys": keys, "versions": versions,
		"created_at": created, "attempts": attempts, "last_errors": errs, "max_attempts": maxAttempts})
	if err != nil {
		return 0, fmt.Errorf("requeue outbox events: %w", err)
	}
	return parked, nil
}

// EventCounts is what CountEvents counts.
type EventCounts struct {
	// Pending and Parked count the events waiting for delivery and the
	// parked ones.
	Pending, Parked int64
	// OldestPending is how long the oldest waiting event has waited (0 when
	// none waits).
	OldestPending time.Duration
}

// CountEvents counts the events waiting for delivery and the parked ones,
// and tells the age of the oldest waiting one.
func (s *Store) CountEvents(ctx context.Context, db DB) (EventCounts, error) {
	var c EventCounts
	var oldestMs int64
	if err := countEventsSQL.queryRow(ctx, db, nil).Scan(&c.Pending, &c.Parked, &oldestMs); err != nil {
		return EventCounts{}, fmt.Errorf("count outbox events: %w", err)
	}
	c.OldestPending = time.Duration(oldestMs) * time.Millisecond
	return c, nil
}
