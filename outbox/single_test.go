package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// TestSingleCommitAboveFloor: a single-commit execution's row, completed
// or claimed at its first step, is written at the version floor + 1 with
// its outbox event, and a key claimed meanwhile by a two-phase claim is
// lost, with nothing of the execution committed.
func TestSingleCommitAboveFloor(t *testing.T) {
	b := setup(t)
	exerciseSingleAboveFloor(t, b.ctx, b.pool, b.store)
}

func exerciseSingleAboveFloor(t *testing.T, ctx context.Context, pool *pgxpool.Pool, store *outbox.Store) {
	t.Helper()
	_, err := pool.Exec(ctx, "UPDATE idempotency_version_floor SET version = 41")
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, store.PrepareSession(ctx, conn.Conn()))
	events := func(ref keystate.Ref) []int64 {
		rows, err := pool.Query(ctx, "SELECT version FROM outbox WHERE scope = $1 AND key = $2 ORDER BY id", ref.Scope, ref.Key)
		require.NoError(t, err)
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return versions
	}
	begin := func(ref keystate.Ref) outbox.SingleBegin {
		var opened outbox.SingleBegin
		var b pgx.Batch
		b.Queue("begin")
		store.QueueSingleBegin(&b, ref, time.Minute, &opened)
		require.NoError(t, conn.SendBatch(ctx, &b).Close())
		require.True(t, opened.Locked)
		require.False(t, opened.HasRow)
		return opened
	}

	// Completed.
	done := keystate.Ref{Scope: "floor", Key: "done"}
	opened := begin(done)
	var k keystate.Key
	var b pgx.Batch
	store.QueueSingleComplete(&b, done, "v1:fp", keystate.Response{Status: 200, Body: []byte("ok")}, opened.Floor, &k)
	b.Queue("commit")
	require.NoError(t, conn.SendBatch(ctx, &b).Close())
	require.Equal(t, keystate.Completed, k.Status)
	require.Equal(t, int64(42), k.Version)
	require.Equal(t, []int64{42}, events(done))

	// Claimed at the first step (promoted).
	promoted := keystate.Ref{Scope: "floor", Key: "promoted"}
	owner := keystate.NewOwner()
	opened = begin(promoted)
	claimed := false
	b = pgx.Batch{}
	store.QueueSinglePromote(&b, promoted, "v1:fp", owner, time.Minute, opened.Floor, &k, &claimed)
	b.Queue("commit")
	require.NoError(t, conn.SendBatch(ctx, &b).Close())
	require.True(t, claimed)
	require.Equal(t, keystate.InProgress, k.Status)
	require.Equal(t, owner, k.Owner)
	require.Equal(t, int64(42), k.Version)
	require.Positive(t, k.LeaseRemaining)
	require.Equal(t, []int64{42}, events(promoted))

	// On one Postgres a two-phase claim takes the key's lock, which the
	// single-commit transaction holds: it is turned away.
	dist, err := store.Distribution(ctx, pool)
	require.NoError(t, err)
	if dist != outbox.ByScope {
		busy := keystate.Ref{Scope: "floor", Key: "busy"}
		begin(busy)
		_, err := store.Claim(ctx, pool, busy, "v1:fp", keystate.NewOwner(), time.Minute)
		require.ErrorIs(t, err, outbox.ErrKeyBusy)
		_, err = conn.Exec(ctx, "rollback")
		require.NoError(t, err)
		require.Empty(t, events(busy))
		return
	}

	// On Citus the claims take no key lock: a single-commit execution can
	// lose its key to a two-phase claim, and then nothing of it commits
	// (the insert fails, and the COMMIT is skipped).
	for _, completes := range []bool{true, false} {
		lost := keystate.Ref{Scope: "floor", Key: "lost-" + map[bool]string{true: "complete", false: "promote"}[completes]}
		opened = begin(lost)
		res, err := store.Claim(ctx, pool, lost, "v1:fp", keystate.NewOwner(), time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		b = pgx.Batch{}
		claimed = false
		if completes {
			store.QueueSingleComplete(&b, lost, "v1:fp", keystate.Response{Status: 200}, opened.Floor, &k)
		} else {
			store.QueueSinglePromote(&b, lost, "v1:fp", owner, time.Minute, opened.Floor, &k, &claimed)
		}
		b.Queue("commit")
		err = conn.SendBatch(ctx, &b).Close()
		if completes || err != nil {
			require.ErrorIs(t, err, outbox.ErrLeaseLost)
			_, err = conn.Exec(ctx, "rollback") // the COMMIT was skipped
			require.NoError(t, err)
		}
		require.False(t, claimed)
		require.Equal(t, []int64{res.Key.Version}, events(lost), "only the two-phase claim's event")
	}
}
