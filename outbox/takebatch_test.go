package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// TestTakeBatchInEveryQueryMode runs the relay's take (its BEGIN sent with
// the statement in one round trip) through pgx's query modes, straight to
// Postgres and through a real PgBouncer, as TestEveryStatementInEveryQueryMode
// does for the other statements.
func TestTakeBatchInEveryQueryMode(t *testing.T) {
	inEveryQueryMode(t, exerciseTakeBatch)
}

// TestTakeBatchByScope: the same, scope by scope, as on a distributed
// database (Citus).
func TestTakeBatchByScope(t *testing.T) {
	t.Parallel()
	exerciseTakeBatchAs(t, oncetest.Context(t), oncetest.DB(t), outbox.ByScope)
}

// TestConcurrentTakesByScope: relays taking scope by scope, as on a
// distributed database (Citus), several at once, never take the same
// event, and take them all.
func TestConcurrentTakesByScope(t *testing.T) {
	t.Parallel()
	exerciseConcurrentTakes(t, oncetest.Context(t), oncetest.DB(t), outbox.ByScope)
}

// exerciseConcurrentTakes writes events of several scopes, then has four
// relays (each a store of its own, as in four processes) take and commit
// batches at once until none is left, and checks that every event was
// taken exactly once, each batch from one scope (on Citus, from one shard:
// without the take's scope test a batch spans scopes, and Citus refuses
// its FOR UPDATE and ctid).
func exerciseConcurrentTakes(t *testing.T, ctx context.Context, pool *pgxpool.Pool, dist outbox.Distribution) {
	t.Helper()
	prefix := "take-" + oncetest.RandomSuffix(6) + "-"
	_, err := pool.Exec(ctx, `INSERT INTO outbox (scope, key, version)
		SELECT $1 || (i % 7), 'k' || i, 1 FROM generate_series(1, 700) i`, prefix)
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		taken = map[int64]int{}
		wg    sync.WaitGroup
	)
	errs := make([]error, 4)
	for i := range errs {
		store := outbox.New(outbox.Config{Distribution: dist})
		wg.Go(func() {
			errs[i] = takeUntilEmpty(ctx, store, pool, dist, func(e outbox.Event) {
				if strings.HasPrefix(e.Scope, prefix) {
					mu.Lock()
					taken[e.ID]++
					mu.Unlock()
				}
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, taken, 700, "every event taken")
	for id, n := range taken {
		require.Equal(t, 1, n, "event %d taken %d times", id, n)
	}
}

// takeUntilEmpty takes and commits batches until three takes in a row come
// back empty, calling took with every event taken. With a distribution
// other than SingleNode, a batch of several scopes is an error.
func takeUntilEmpty(ctx context.Context, store *outbox.Store, pool *pgxpool.Pool, dist outbox.Distribution, took func(outbox.Event)) error {
	for empty := 0; empty < 3; {
		tx, batch, err := store.TakeBatch(ctx, pool, 25, 64)
		if err != nil {
			return err
		}
		if tx == nil {
			empty++
			continue
		}
		empty = 0
		for _, e := range batch.Events {
			if dist != outbox.SingleNode && e.Scope != batch.Events[0].Scope {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("a batch of scopes %s and %s: a batch is one scope's, taken on its shard", batch.Events[0].Scope, e.Scope)
			}
			took(e)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// exerciseTakeBatch checks what TakeBatch returns, that its transaction
// holds the deletes until it commits, commits without waiting for the WAL
// flush, and that two open takes never share an event.
func exerciseTakeBatch(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	exerciseTakeBatchAs(t, ctx, pool, outbox.DetectDistribution)
}

// exerciseTakeBatchAs is exerciseTakeBatch with a store of Distribution
// dist.
func exerciseTakeBatchAs(t *testing.T, ctx context.Context, pool *pgxpool.Pool, dist outbox.Distribution) {
	t.Helper()
	store := outbox.New(outbox.Config{Distribution: dist})
	// a: completed with a body over the limit; b: gone from Postgres (a
	// deletion at the highest version its events carry); c: failed.
	_, err := pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_content_type, response_body, expires_at)
			VALUES ('s', 'a', 'completed', 2, 'v1:a', 201, 'application/json', '{"id":1}', now() + interval '1 hour');
		INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, expires_at)
			VALUES ('s', 'c', 'failed', 1, 'v1:c', now() + interval '1 hour');
		INSERT INTO outbox (scope, key, version) VALUES ('s', 'a', 1), ('s', 'b', 5), ('s', 'a', 2), ('s', 'b', 3), ('s', 'c', 1);
		INSERT INTO outbox (scope, key, version, parked_at) VALUES ('s', 'parked', 1, now())`)
	require.NoError(t, err)
	a, b, c := keystate.Ref{Scope: "s", Key: "a"}, keystate.Ref{Scope: "s", Key: "b"}, keystate.Ref{Scope: "s", Key: "c"}
	pending := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE parked_at IS NULL`).Scan(&n))
		return n
	}

	tx, batch, err := store.TakeBatch(ctx, pool, 1000, 4)
	require.NoError(t, err)
	require.Len(t, batch.Events, 5, "every unparked event, the parked one left")
	for i, want := range []struct {
		ref     keystate.Ref
		version int64
	}{{a, 1}, {b, 5}, {a, 2}, {b, 3}, {c, 1}} {
		require.Equal(t, want.ref, batch.Events[i].Ref(), "events in id order")
		require.Equal(t, want.version, batch.Events[i].Version)
		require.WithinDuration(t, time.Now(), batch.Events[i].CreatedAt, time.Minute)
	}
	require.Len(t, batch.Updates, 3, "one update per key")
	updates := map[keystate.Ref]keystate.Key{}
	for _, k := range batch.Updates {
		updates[k.Ref] = k
	}
	require.Equal(t, keystate.Completed, updates[a].Status)
	require.EqualValues(t, 2, updates[a].Version)
	require.Equal(t, 201, updates[a].Response.Status)
	require.Equal(t, "application/json", updates[a].Response.ContentType)
	require.True(t, updates[a].BodyOmitted, "a body over the limit is left out")
	require.Nil(t, updates[a].Response.Body)
	require.Positive(t, updates[a].ExpiresIn)
	require.Equal(t, keystate.Gone(b, 5), updates[b], "a key gone from Postgres: a deletion at its highest version")
	require.Equal(t, keystate.Failed, updates[c].Status)
	require.Equal(t, "v1:c", updates[c].Fingerprint)

	var durability string
	require.NoError(t, tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&durability))
	require.Equal(t, "off", durability, "the take's transaction does not wait for its WAL flush")
	require.Equal(t, 5, pending(), "the deletes are the transaction's until it commits")

	// Another take meanwhile finds nothing: the rows are locked. An empty
	// take leaves no transaction.
	tx2, other, err := store.TakeBatch(ctx, pool, 1000, 4)
	require.NoError(t, err)
	require.Empty(t, other.Events)
	require.Nil(t, tx2)

	// A rollback puts every event back.
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 5, pending())

	// Two takes open at once share no event; each commit deletes its own.
	tx, first, err := store.TakeBatch(ctx, pool, 2, 4)
	require.NoError(t, err)
	tx2, second, err := store.TakeBatch(ctx, pool, 2, 4)
	require.NoError(t, err)
	require.Len(t, first.Events, 2)
	require.Len(t, second.Events, 2)
	require.Greater(t, second.Events[0].ID, first.Events[1].ID, "the second take skips the rows the first holds")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx2.Commit(ctx))
	require.Equal(t, 1, pending())

	// A failed take leaves no transaction open (the pool's connection is
	// usable after it).
	_, _, err = store.TakeBatch(ctx, pool, -1, 4)
	require.Error(t, err, "a negative LIMIT is refused")
	require.Equal(t, 1, pending())
}
