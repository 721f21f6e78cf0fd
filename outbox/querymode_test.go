package outbox_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// withQueryMode returns dbURL with pgx's default_query_exec_mode set.
func withQueryMode(t *testing.T, dbURL, mode string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestEveryStatementInEveryQueryMode runs every store statement through
// pgx's query modes: its default (named prepared statements) and exec and
// simple_protocol, the two modes PgBouncer in transaction mode allows,
// straight to Postgres and through a real PgBouncer. The owner goes out as
// a uuid and JSON as text in all of them; a [16]byte or a []byte for jsonb
// has no encoding in the last two.
func TestEveryStatementInEveryQueryMode(t *testing.T) {
	inEveryQueryMode(t, exerciseStore)
}

// TestEveryStatementByScope runs every store method as on a distributed
// database (Citus): the statements scope by scope, each scope's in a
// transaction of its own with its SET LOCAL settings. They are plain SQL,
// so one Postgres runs them too, through every query mode and PgBouncer;
// make test-citus runs the same on Citus (citus_test.go).
func TestEveryStatementByScope(t *testing.T) {
	inEveryQueryMode(t, func(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
		t.Helper()
		exerciseStoreAs(t, ctx, pool, outbox.ByScope)
	})
}

// inEveryQueryMode runs exercise, in parallel subtests, on a pool of every
// query mode, straight to Postgres and through a real PgBouncer.
func inEveryQueryMode(t *testing.T, exercise func(t *testing.T, ctx context.Context, pool *pgxpool.Pool)) {
	t.Parallel()
	for _, tc := range []struct {
		name, mode string
		bouncer    bool
	}{
		{name: "direct/cache_statement", mode: "cache_statement"},
		{name: "direct/exec", mode: "exec"},
		{name: "direct/simple_protocol", mode: "simple_protocol"},
		{name: "pgbouncer/exec", mode: "exec", bouncer: true},
		{name: "pgbouncer/simple_protocol", mode: "simple_protocol", bouncer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := oncetest.DatabaseURL(t)
			if tc.bouncer {
				dbURL = oncetest.PgBouncerURL(t, dbURL, tc.mode)
			} else {
				dbURL = withQueryMode(t, dbURL, tc.mode)
			}
			exercise(t, oncetest.Context(t), oncetest.Pool(t, dbURL))
		})
	}
}

// exerciseStore runs every Store method once on pool and checks what each
// returns.
func exerciseStore(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	exerciseStoreAs(t, ctx, pool, outbox.DetectDistribution)
}

// exerciseStoreAs is exerciseStore with a store of Distribution dist.
func exerciseStoreAs(t *testing.T, ctx context.Context, pool *pgxpool.Pool, dist outbox.Distribution) {
	t.Helper()
	store := outbox.New(outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute, Distribution: dist})
	ownerC := keystate.NewOwner()
	a, b, c := keystate.Ref{Scope: "s", Key: "a"}, keystate.Ref{Scope: "s", Key: "b"}, keystate.Ref{Scope: "s", Key: "c"}

	require.NoError(t, store.Notify(ctx, pool))

	// claim_insert, then claim_peek of a held key.
	res, err := store.Claim(ctx, pool, a, "v1:fp", ownerA, time.Minute)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, ownerA, res.Key.Owner)
	require.InDelta(t, float64(time.Minute), float64(res.Key.LeaseRemaining), float64(time.Second))
	res, err = store.Claim(ctx, pool, a, "v1:fp", ownerB, time.Minute)
	require.NoError(t, err)
	require.False(t, res.Claimed)
	require.Equal(t, ownerA, res.Key.Owner, "the holder is read back")

	// claim_batch, then claim_peek from ClaimHeld.
	batched := keystate.Ref{Scope: "s", Key: "batched"}
	claims, err := store.ClaimNew(ctx, pool, []outbox.ClaimRequest{
		{Ref: batched, Fingerprint: "v1:fp", Owner: ownerB},
		{Ref: a, Fingerprint: "v1:fp", Owner: ownerC},
	}, time.Minute, time.Second)
	require.NoError(t, err)
	require.True(t, claims[0].Claimed)
	require.Equal(t, ownerB, claims[0].Key.Owner)
	require.False(t, claims[1].Claimed, "a has a row")
	res, err = store.ClaimHeld(ctx, pool, a, "v1:fp", ownerC, time.Minute)
	require.NoError(t, err)
	require.False(t, res.Claimed)
	require.Equal(t, ownerA, res.Key.Owner)

	// heartbeat, record_step, renew_leases, hand_off, resume_claim.
	require.NoError(t, store.Heartbeat(ctx, pool, a, ownerA, 2*time.Minute))
	require.ErrorIs(t, store.Heartbeat(ctx, pool, a, ownerB, time.Minute), outbox.ErrLeaseLost)
	require.NoError(t, store.RecordStep(ctx, pool, a, ownerA, "charge", []byte(`{}`), "h", []byte("request\x00body"), false))
	require.NoError(t, store.RecordStep(ctx, pool, a, ownerA, "charge", []byte(`{"outcome":{"id":"ch_1"}}`), "h", nil, true))
	held, err := store.RenewLeases(ctx, pool, []outbox.Lease{{Ref: a, Owner: ownerA}, {Ref: a, Owner: ownerB}}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[keystate.Owner]bool{ownerA: true}, held)
	k, err := store.HandOff(ctx, pool, a, ownerA)
	require.NoError(t, err)
	require.Equal(t, int64(2), k.Version)
	resumed, err := store.ResumeClaim(ctx, pool, []string{"h"}, []keystate.Owner{ownerC}, time.Minute)
	require.NoError(t, err)
	require.Len(t, resumed, 1)
	require.Equal(t, ownerC, resumed[0].Key.Owner)
	require.Equal(t, "h", resumed[0].Handler)
	require.Equal(t, []byte("request\x00body"), resumed[0].Request)
	require.JSONEq(t, `{"charge":{"outcome":{"id":"ch_1"}}}`, string(resumed[0].Steps))

	// steps_in_progress: a settled step and one in flight.
	require.NoError(t, store.RecordStep(ctx, pool, a, ownerC, "capture", []byte(`{}`), "h", nil, false))
	steps, err := store.StepsInProgress(ctx, pool, []keystate.Ref{a, batched, b})
	require.NoError(t, err)
	require.Equal(t, map[keystate.Ref][]outbox.StepState{a: {{Name: "capture"}, {Name: "charge", Settled: true}}}, steps)

	// finish (completed), get_key.
	resp := keystate.Response{Status: 201, ContentType: "application/json",
		Header: http.Header{"Location": {"/v1/x"}}, Body: []byte(`{"ok":true}`)}
	k, err = store.Complete(ctx, pool, a, ownerC, resp)
	require.NoError(t, err)
	require.Equal(t, keystate.Completed, k.Status)
	require.Equal(t, int64(4), k.Version)
	got, found, err := store.Get(ctx, pool, a)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, resp, got.Response)
	require.True(t, got.Owner.IsZero())

	// finish (failed), claim_takeover.
	_, err = store.Claim(ctx, pool, b, "v1:fp", ownerA, time.Minute)
	require.NoError(t, err)
	k, err = store.Fail(ctx, pool, b, ownerA, true)
	require.NoError(t, err)
	require.Equal(t, 1, k.Failures)
	res, err = store.Claim(ctx, pool, b, "v1:fp", ownerB, time.Minute)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.Equal(t, ownerB, res.Key.Owner)
	require.Equal(t, 1, res.Key.Failures, "a retry of a failed key keeps its count")

	// count_reapable, reap_leases.
	_, err = store.Claim(ctx, pool, c, "v1:fp", ownerA, time.Millisecond)
	require.NoError(t, err)
	oncetest.AwaitLeaseOver(t, ctx, pool, c, 0)
	n, err := store.CountReapable(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = store.ReapLeases(ctx, pool, 0, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// purge, count_expired, delete_expired, scan_live, live_keys.
	_, _, err = store.Purge(ctx, pool, b, false)
	require.ErrorIs(t, err, outbox.ErrKeyInProgress)
	_, purged, err := store.Purge(ctx, pool, b, true)
	require.NoError(t, err)
	require.True(t, purged)
	n, err = store.CountExpired(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = store.DeleteExpired(ctx, pool, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var scanned []keystate.Ref
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return store.ScanLive(ctx, tx, func(k keystate.Key) error {
			scanned = append(scanned, k.Ref)
			return nil
		})
	})
	require.NoError(t, err)
	require.ElementsMatch(t, []keystate.Ref{a, c, batched}, scanned)
	live, err := store.Live(ctx, pool, []keystate.Ref{a, b, c})
	require.NoError(t, err)
	require.Equal(t, map[keystate.Ref]bool{a: true, c: true}, live)

	// take_batch, current_keys, requeue_events, count_events.
	tx, batch, err := store.TakeBatch(ctx, pool, 1000, 4)
	require.NoError(t, err)
	require.Len(t, batch.Events, 11)
	current, err := store.CurrentKeys(ctx, tx, []keystate.Ref{a, b, c}, 4)
	require.NoError(t, err)
	require.Len(t, current, 2)
	require.True(t, current[a].BodyOmitted, "a body over the limit is left out")
	require.Equal(t, keystate.Failed, current[c].Status)
	requeued, err := store.Requeue(ctx, tx, []outbox.FailedEvent{{Event: batch.Events[0], Err: errors.New("refused")}}, 1)
	require.NoError(t, err)
	require.Equal(t, 1, requeued)
	require.NoError(t, tx.Commit(ctx))
	counts, err := store.CountEvents(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, counts.Pending)
	require.EqualValues(t, 1, counts.Parked)
	require.Zero(t, counts.OldestPending)
	exerciseAdmin(t, ctx, pool, store, a)

	exerciseBatched(t, ctx, pool, store)
}

// exerciseBatched runs the statements the engine sends in a batch with a
// transaction's BEGIN or COMMIT (single_begin, single_finish, finish as
// QueueComplete queues it), and the rest of the single-commit mode
// (session_keepalives, single_finish as SingleFail) and try_lock.
func exerciseBatched(t *testing.T, ctx context.Context, pool *pgxpool.Pool, store *outbox.Store) {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	// session_keepalives (with the distribution, PrepareSession),
	// single_begin, single_finish (completed).
	require.NoError(t, store.PrepareSession(ctx, conn.Conn()))
	single := keystate.Ref{Scope: "s", Key: "single"}
	resp := keystate.Response{Status: 201, ContentType: "application/json",
		Header: http.Header{"Location": {"/v1/y"}}, Body: []byte(`{"ok":1}`)}
	var opened outbox.SingleBegin
	var k keystate.Key
	var b pgx.Batch
	b.Queue("begin")
	store.QueueSingleBegin(&b, single, time.Minute, &opened)
	require.NoError(t, conn.SendBatch(ctx, &b).Close())
	require.True(t, opened.Locked)
	require.False(t, opened.HasRow)
	b = pgx.Batch{}
	store.QueueSingleComplete(&b, single, "v1:fp", resp, opened.Floor, &k)
	b.Queue("commit")
	require.NoError(t, conn.SendBatch(ctx, &b).Close())
	require.Equal(t, keystate.Completed, k.Status)
	require.Equal(t, resp, k.Response)

	// single_finish failing (the key has a row now), then as SingleFail.
	b = pgx.Batch{}
	b.Queue("begin")
	store.QueueSingleBegin(&b, single, time.Minute, &opened)
	store.QueueSingleComplete(&b, single, "v1:fp", resp, opened.Floor, &k) // the key has a row: no floor needed
	b.Queue("commit")
	require.ErrorIs(t, conn.SendBatch(ctx, &b).Close(), outbox.ErrLeaseLost)
	_, err = conn.Exec(ctx, "rollback") // the COMMIT was skipped
	require.NoError(t, err)
	require.True(t, opened.Locked)
	require.True(t, opened.HasRow)
	_, written, err := store.SingleFail(ctx, pool, single, "v1:fp", true)
	require.NoError(t, err)
	require.False(t, written)
	failed, written, err := store.SingleFail(ctx, pool, keystate.Ref{Scope: "s", Key: "single-failed"}, "v1:fp", true)
	require.NoError(t, err)
	require.True(t, written)
	require.Equal(t, keystate.Failed, failed.Status)
	require.Equal(t, 1, failed.Failures)

	// finish (completed) as QueueComplete queues it, held and lost.
	held := keystate.Ref{Scope: "s", Key: "queued"}
	_, err = store.Claim(ctx, pool, held, "v1:fp", ownerA, time.Minute)
	require.NoError(t, err)
	b = pgx.Batch{}
	store.QueueComplete(&b, held, ownerA, resp, &k)
	require.NoError(t, conn.SendBatch(ctx, &b).Close())
	require.Equal(t, keystate.Completed, k.Status)
	b = pgx.Batch{}
	store.QueueComplete(&b, held, ownerA, resp, &k)
	require.ErrorIs(t, conn.SendBatch(ctx, &b).Close(), outbox.ErrLeaseLost)

	// try_lock.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		locked, err := store.TryLock(ctx, tx, 42)
		require.True(t, locked)
		return err
	}))
}

// exerciseAdmin runs the operators' statements: unpark_events,
// raise_version_floor_key and delete_key (after a purge), count_stuck,
// record_pass.
func exerciseAdmin(t *testing.T, ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, ref keystate.Ref) {
	t.Helper()
	var parked int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox WHERE parked_at IS NOT NULL LIMIT 1`).Scan(&parked))
	n, err := store.Unpark(ctx, pool, []int64{parked, -1})
	require.NoError(t, err)
	require.Equal(t, 1, n)

	stuck, err := store.CountStuck(ctx, pool, time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, stuck, 0)

	_, found, err := store.Purge(ctx, pool, ref, true)
	require.NoError(t, err)
	require.True(t, found)
	deleted, err := store.DeletePurged(ctx, pool, ref)
	require.NoError(t, err)
	require.True(t, deleted)

	require.NoError(t, store.RecordPass(ctx, pool, outbox.Pass{Result: "ok", Report: []byte(`{"scanned":1}`), Duration: time.Second}))
	require.NoError(t, store.RecordPass(ctx, pool, outbox.Pass{Result: "failed", Report: []byte(`{}`), Err: errors.New("down")}))
}
