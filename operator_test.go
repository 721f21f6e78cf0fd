package onceonly_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

func (b *testBundle) versionOf(t *testing.T, key string) int64 {
	t.Helper()
	var v int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT version FROM idempotency_keys WHERE scope = 'm' AND key = $1`, key).Scan(&v))
	return v
}

// hold starts a request for key in scope on e whose handler waits once it
// holds the key, and returns when it does. finish lets the handler go on
// (it writes a payment) and returns the request's error.
func (b *testBundle) hold(e *onceonly.Engine, scope, key string) (finish func() error) {
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(b.ctx, scope, key, []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			close(started)
			<-release
			return payment(201, `{}`)(ctx, tx)
		})
		done <- err
	}()
	<-started
	return func() error {
		close(release)
		return <-done
	}
}

func TestDeleteRemovesTheRowAndTheRedisValue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	completed := b.versionOf(t, "k")

	require.NoError(t, b.engine.Delete(b.ctx, "m", "k", false))
	require.Equal(t, "absent", b.keyStatus(t, "k"), "the row is deleted")
	require.Zero(t, b.rdb.Exists(b.ctx, b.prefix+"m:k").Val(), "the Redis value is deleted")
	require.Equal(t, 1, b.payments(t), "the business rows stay")
	require.ErrorIs(t, b.engine.Delete(b.ctx, "m", "k", false), onceonly.ErrNoSuchKey)

	// The key comes back as a first execution, above every version it had:
	// an old copy of it (a late event, a Redis value) can never outrank it.
	out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.False(t, out.Replayed)
	require.Equal(t, 2, b.payments(t))
	require.Greater(t, b.versionOf(t, "k"), completed+1, "above the purge's version")
}

func TestDeleteOfAKeyInProgressNeedsForceAndFencesItsHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	finish := b.hold(b.engine, "m", "k")
	require.ErrorIs(t, b.engine.Delete(b.ctx, "m", "k", false), onceonly.ErrKeyInProgress)
	require.Equal(t, "in_progress", b.keyStatus(t, "k"))
	require.NoError(t, b.engine.Delete(b.ctx, "m", "k", true))
	require.Equal(t, "absent", b.keyStatus(t, "k"))
	require.ErrorIs(t, finish(), onceonly.ErrLeaseLost, "the holder cannot complete a deleted key")
	require.Zero(t, b.payments(t), "its business writes rolled back")
}

func TestRepairCacheWritesThePostgresState(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"id":1}`))
	require.NoError(t, err)
	inSync := func() bool {
		in, err := b.engine.Inspect(b.ctx, "m", "k")
		require.NoError(t, err)
		return in.InSync()
	}

	changed, err := b.engine.RepairCache(b.ctx, "m", "k")
	require.NoError(t, err)
	require.False(t, changed, "in step: nothing to write")

	for name, spoil := range map[string]func() error{
		"missing": func() error { return b.rdb.Del(b.ctx, b.prefix+"m:k").Err() },
		"corrupt": func() error { return b.rdb.Set(b.ctx, b.prefix+"m:k", "garbage", time.Minute).Err() },
		"stale":   func() error { return b.rdb.Set(b.ctx, b.prefix+"m:k", "failed:1:", time.Minute).Err() },
		"ahead":   func() error { return b.rdb.Set(b.ctx, b.prefix+"m:k", "failed:99:", time.Minute).Err() },
	} {
		require.NoError(t, spoil(), name)
		require.False(t, inSync(), name)
		repaired, err := b.engine.RepairCache(b.ctx, "m", "k")
		require.NoError(t, err, name)
		require.True(t, repaired, name)
		require.True(t, inSync(), name)
	}

	// A value with no row is deleted.
	require.NoError(t, b.rdb.Set(b.ctx, b.prefix+"m:orphan", "completed:3:", time.Minute).Err())
	changed, err = b.engine.RepairCache(b.ctx, "m", "orphan")
	require.NoError(t, err)
	require.True(t, changed)
	require.Zero(t, b.rdb.Exists(b.ctx, b.prefix+"m:orphan").Val())

	noRedis := setup(t, setupOpts{noRedis: true})
	_, err = noRedis.engine.RepairCache(b.ctx, "m", "k")
	require.ErrorIs(t, err, onceonly.ErrNoRedis)
}

func TestRepairCacheLeavesARequestInFlightAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	finish := b.hold(b.engine, "m", "k")
	before, err := b.rdb.Get(b.ctx, b.prefix+"m:k").Result()
	require.NoError(t, err)
	_, err = b.engine.RepairCache(b.ctx, "m", "k")
	require.NoError(t, err)
	after, err := b.rdb.Get(b.ctx, b.prefix+"m:k").Result()
	require.NoError(t, err)
	require.Equal(t, before[:len("in_progress:")], after[:len("in_progress:")], "still held in Redis")
	require.NoError(t, finish())
	out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.True(t, out.Replayed)
}

func TestUnparkPutsParkedEventsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var parked, pending int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO outbox (scope, key, version, attempts, parked_at, last_error)
		VALUES ('m', 'k', 1, 10, now(), 'refused') RETURNING id`).Scan(&parked))
	require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO outbox (scope, key, version) VALUES ('m', 'k2', 1) RETURNING id`).Scan(&pending))
	n, err := b.engine.Unpark(b.ctx, []int64{parked, pending, 999_999})
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the parked event")
	var attempts int
	var parkedAt *time.Time
	var lastError string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT attempts, parked_at, last_error FROM outbox WHERE id = $1`, parked).Scan(&attempts, &parkedAt, &lastError))
	require.Zero(t, attempts)
	require.Nil(t, parkedAt)
	require.Equal(t, "refused", lastError, "the reason stays until a new attempt replaces it")
	n, err = b.engine.Unpark(b.ctx, []int64{parked})
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestRequestCountsAreTheEnginesCounters(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	require.Zero(t, b.engine.RequestCounts()["executed"])
	for range 2 {
		_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
		require.NoError(t, err)
	}
	_, err := b.engine.Do(b.ctx, "m", "k2", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{}, errors.New("no")
	})
	require.Error(t, err)
	counts := b.engine.RequestCounts()
	require.Equal(t, 1.0, counts["executed"])
	require.Equal(t, 1.0, counts["replayed_cache"])
	require.Equal(t, b.outcomes("executed"), counts["executed"], "the exported counter's value")
	require.Positive(t, counts["handler_error"]+counts["failed"])
}
