package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// bundle is a test's stack, with the relay's helpers.
type bundle struct{ *oncetest.Stack }

// setup returns a stack on the shared test servers unless opts say
// otherwise (oncetest.OnRedis, oncetest.OnPool).
func setup(t testing.TB, opts ...oncetest.StackOption) *bundle {
	t.Helper()
	return &bundle{oncetest.NewStack(t, opts...)}
}

// relay returns a relay on the stack, configured by cfg otherwise; it
// listens on a direct connection unless cfg says where.
func (b *bundle) relay(t testing.TB, cfg Config) *Relay {
	t.Helper()
	b.Configure(t, &cfg)
	if cfg.Listen == nil {
		cfg.Listen = b.Pool.Config().ConnConfig // a direct connection: LISTEN works
	}
	r, err := New(cfg)
	require.NoError(t, err)
	return r
}

// run starts r.Run and stops it when the test ends, failing the test if
// it does not stop within 10s.
func run(t *testing.T, ctx context.Context, r *Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("relay did not stop within 10s")
		}
	})
}

var owner = keystate.Owner{7}

// churn moves a key one transition on: claim it (failed or new) or finish it.
func (b *bundle) churn(ctx context.Context, scope, key string) error {
	k, found, err := b.Store.Get(ctx, b.Pool, keystate.Ref{Scope: scope, Key: key})
	if err != nil {
		return err
	}
	if !found || k.Status == keystate.Failed {
		_, err = b.Store.Claim(ctx, b.Pool, keystate.Ref{Scope: scope, Key: key}, "v1:fp", owner, time.Minute)
		if errors.Is(err, outbox.ErrKeyBusy) {
			return nil // another writer's claim holds the key's lock
		}
		return err
	}
	if k.Status == keystate.InProgress {
		// Another writer may have failed it first.
		if _, err = b.Store.Fail(ctx, b.Pool, keystate.Ref{Scope: scope, Key: key}, owner, true); errors.Is(err, outbox.ErrLeaseLost) {
			return nil
		}
		return err
	}
	return nil
}

func (b *bundle) outboxLen(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

// awaitListening waits until r listens for notifications and its wake-ups
// at start (Run's own, the one after LISTEN) have been taken: an event
// written after it is delivered because of its NOTIFY. It returns the
// process id of the listening connection's backend.
func (b *bundle) awaitListening(t testing.TB, r *Relay) int {
	t.Helper()
	return b.awaitListeningAgain(t, r, 0)
}

// awaitListeningAgain is awaitListening on a connection other than the
// one whose backend was gone (a connection the test cut).
func (b *bundle) awaitListeningAgain(t testing.TB, r *Relay, gone int) int {
	t.Helper()
	var pid int
	oncetest.Eventually(t, 10*time.Second, "the relay listening", func() bool {
		err := b.Pool.QueryRow(b.Ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %' AND state = 'idle' AND pid <> $1`, gone).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return len(r.wake) == 0
	})
	return pid
}

func TestDrainDeliversCurrentState(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		for i := range 20 {
			b.Complete(t, "s", fmt.Sprintf("k%d", i), `{"ok":true}`)
		}
		large := strings.Repeat("x", cache.DefaultMaxBody+1)
		b.Complete(t, "s", "large", large)
		_, err := b.Store.Claim(b.Ctx, b.Pool, keystate.Ref{Scope: "s", Key: "running"}, "v1:fp", owner, time.Minute)
		require.NoError(t, err)
		// An event whose key is gone from Postgres deletes the Redis copy.
		_, err = b.Cache.Apply(b.Ctx, keystate.Key{Ref: keystate.Ref{Scope: "s", Key: "gone"}, Version: 1, Status: keystate.Failed, Fingerprint: "v1:fp", ExpiresIn: time.Hour})
		require.NoError(t, err)
		_, err = b.Pool.Exec(b.Ctx, `INSERT INTO outbox (scope, key, version) VALUES ('s', 'gone', 2)`)
		require.NoError(t, err)

		r := b.relay(t, Config{BatchSize: 7})
		n, err := r.Drain(b.Ctx)
		require.NoError(t, err)
		require.Equal(t, 2*21+1+1, n)
		require.Zero(t, b.outboxLen(t))
		b.RequireConverged(t)

		e, _, err := b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "k3"})
		require.NoError(t, err)
		require.Equal(t, `{"ok":true}`, string(e.Response.Body))
		e, _, err = b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "large"})
		require.NoError(t, err)
		require.True(t, e.BodyInPostgres, "a large body stays in Postgres")
		e, _, err = b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "running"})
		require.NoError(t, err)
		require.Equal(t, keystate.InProgress, e.State)
		require.Equal(t, owner, e.Owner)
		_, found, err := b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "gone"})
		require.NoError(t, err)
		require.False(t, found, "a key deleted from Postgres is deleted from Redis")

		n, err = r.Drain(b.Ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

func TestOldAndRepeatedDeliveriesNeverLowerAVersion(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		b.Complete(t, "s", "k", "{}") // Postgres at version 2
		// Redis already holds a newer version than any pending event.
		_, err := b.Cache.Apply(b.Ctx, keystate.Key{Ref: keystate.Ref{Scope: "s", Key: "k"}, Version: 9, Status: keystate.Failed, Fingerprint: "v1:fp", ExpiresIn: time.Hour})
		require.NoError(t, err)
		// The same events again, out of order.
		_, err = b.Pool.Exec(b.Ctx, `INSERT INTO outbox (scope, key, version) VALUES ('s','k',2), ('s','k',1), ('s','k',2)`)
		require.NoError(t, err)
		r := b.relay(t, Config{BatchSize: 2})
		_, err = r.Drain(b.Ctx)
		require.NoError(t, err)
		e, _, err := b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: "k"})
		require.NoError(t, err)
		require.EqualValues(t, 9, e.Version)
		require.Equal(t, keystate.Failed, e.State)
		require.Zero(t, b.outboxLen(t))
	})
}

// TestRelaysUnderChurnNeverRegress runs two relays while writers move a few
// hot keys through transitions and a watcher checks that no key's version
// in Redis ever goes down; at the end Redis equals Postgres.
func TestRelaysUnderChurnNeverRegress(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		for _, r := range []*Relay{b.relay(t, Config{BatchSize: 3}), b.relay(t, Config{BatchSize: 5})} {
			run(t, b.Ctx, r)
		}
		const keys = 8
		ctx, stop := context.WithTimeout(b.Ctx, 2*time.Second)
		defer stop()
		var wg sync.WaitGroup
		var writes atomic.Int64
		for w := range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if err := b.churn(ctx, "s", fmt.Sprintf("hot%d", (w+rand.IntN(keys))%keys)); err != nil && ctx.Err() == nil {
						t.Error(err)
						return
					}
					writes.Add(1)
				}
			})
		}
		seen := map[string]int64{}
		for ctx.Err() == nil {
			for i := range keys {
				key := fmt.Sprintf("hot%d", i)
				e, found, err := b.Cache.Read(b.Ctx, keystate.Ref{Scope: "s", Key: key})
				require.NoError(t, err)
				if found {
					require.GreaterOrEqual(t, e.Version, seen[key], "version of %s went down", key)
					seen[key] = e.Version
				}
			}
		}
		wg.Wait()
		require.Greater(t, writes.Load(), int64(50))
		oncetest.Eventually(t, 10*time.Second, "outbox drained", func() bool { return b.outboxLen(t) == 0 })
		b.RequireConverged(t)
	})
}

func TestTwoRelaysDeliverEveryEventOnce(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, oncetest.OnRedis(rdb))
		const keys = 1000
		_, err := b.Pool.Exec(b.Ctx, `
			INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
			SELECT 's', 'k' || i, 'completed', 3, 'v1:fp', 201, '{}', now() + interval '1 hour' FROM generate_series(1, $1) i`, keys)
		require.NoError(t, err)
		_, err = b.Pool.Exec(b.Ctx, `INSERT INTO outbox (scope, key, version)
			SELECT 's', 'k' || i, v FROM generate_series(1, $1) i, generate_series(1, 3) v ORDER BY random()`, keys)
		require.NoError(t, err)

		relays := []*Relay{b.relay(t, Config{BatchSize: 50}), b.relay(t, Config{BatchSize: 50})}
		counts := make([]int, len(relays))
		errs := make([]error, len(relays))
		var wg sync.WaitGroup
		for i, r := range relays {
			wg.Go(func() {
				counts[i], errs[i] = r.Drain(b.Ctx)
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, 3*keys, counts[0]+counts[1], "every event published exactly once")
		require.Zero(t, b.outboxLen(t))
		b.RequireConverged(t)
		for i, r := range relays {
			require.EqualValues(t, counts[i], testutil.ToFloat64(r.metrics.published))
		}
	})
}

func TestRedisStoppedMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	b := setup(t, oncetest.OnRedis(oncetest.RedisClient(t, srv.URL())))
	r := b.relay(t, Config{PollInterval: 50 * time.Millisecond})
	run(t, b.Ctx, r)

	for i := range 20 {
		b.Complete(t, "s", fmt.Sprintf("before%d", i), "{}")
	}
	oncetest.Eventually(t, 10*time.Second, "first events delivered", func() bool { return b.outboxLen(t) == 0 })

	srv.Stop()
	for i := range 20 {
		b.Complete(t, "s", fmt.Sprintf("during%d", i), "{}")
	}
	oncetest.Eventually(t, 10*time.Second, "a failed push", func() bool {
		return testutil.ToFloat64(r.metrics.errors.WithLabelValues(stageRedis)) > 0
	})
	require.Equal(t, 40, b.outboxLen(t), "events wait in Postgres while Redis is down")

	srv.Start()
	oncetest.Eventually(t, 15*time.Second, "backlog drained after Redis returned", func() bool { return b.outboxLen(t) == 0 })
	// The restarted Redis lost the earlier keys (repairing that is the
	// reconciler's job); every event written while it was down arrived.
	oncetest.RequireConverged(t, b.Ctx, b.Pool, b.Cache, "during%")
}

// TestClusterNodeDownDefersOnlyItsKeys: with one master of a cluster down,
// the keys on the other masters are delivered at once; the rest wait in the
// outbox without using up attempts (so nothing is parked, however long the
// node stays away) and arrive when it is back.
func TestClusterNodeDownDefersOnlyItsKeys(t *testing.T) {
	t.Parallel()
	st, cluster := oncetest.NewClusterStack(t)
	b := &bundle{st}
	const keys = 60
	b.CompleteKeys(t, "s", "k", keys)
	cluster.Nodes[1].Stop()
	r := b.relay(t, Config{BatchSize: 1000, MaxAttempts: 2})
	n, err := r.Drain(b.Ctx)
	require.ErrorIs(t, err, cache.ErrUnavailable)
	require.Positive(t, n, "the keys on the masters that are up are delivered")
	for range 3 { // more tries than MaxAttempts
		n, err := r.Drain(b.Ctx)
		require.ErrorIs(t, err, cache.ErrUnavailable)
		require.Zero(t, n)
	}
	var waiting, attempts, parked int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*), coalesce(sum(attempts), 0), count(parked_at) FROM outbox`).
		Scan(&waiting, &attempts, &parked))
	require.Positive(t, waiting, "the down master's keys wait")
	require.Less(t, waiting, 2*keys)
	require.Zero(t, attempts, "waiting for Redis uses up no attempt")
	require.Zero(t, parked)

	cluster.Nodes[1].Start()
	cluster.WaitHealthy()
	_, err = r.Drain(b.Ctx)
	require.NoError(t, err)
	require.Zero(t, b.outboxLen(t))
	b.RequireConverged(t)
}

func TestCrashAfterPushBeforeDeleteIsHarmless(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 10 {
		b.Complete(t, "s", fmt.Sprintf("k%d", i), "{}")
	}
	r := b.relay(t, Config{})
	crash := errors.New("killed after the Redis push")
	r.afterPush = func() error { return crash }
	_, err := r.Drain(b.Ctx)
	require.ErrorIs(t, err, crash)
	require.Equal(t, 20, b.outboxLen(t), "the events are still in the outbox")
	b.RequireConverged(t) // Redis got them before the crash

	r.afterPush = nil
	n, err := r.Drain(b.Ctx)
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.Zero(t, b.outboxLen(t))
	b.RequireConverged(t)
}

func TestLostNotificationIsCoveredByThePoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{PollInterval: 100 * time.Millisecond})
	run(t, b.Ctx, r)
	// A transition written without its NOTIFY, as if the notification was lost.
	_, err := b.Pool.Exec(b.Ctx, `
		INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, expires_at)
			VALUES ('s', 'quiet', 'failed', 1, 'v1:fp', now() + interval '1 hour');
		INSERT INTO outbox (scope, key, version) VALUES ('s', 'quiet', 1)`)
	require.NoError(t, err)
	oncetest.Eventually(t, 5*time.Second, "the poll delivers the event", func() bool { return b.outboxLen(t) == 0 })
	b.RequireConverged(t)
}

// TestNotificationWakesTheRelayAfterReconnect uses a poll interval far
// longer than the test, so only notifications can deliver; it kills the
// relay's LISTEN connection and checks the relay listens again.
func TestNotificationWakesTheRelayAfterReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{PollInterval: time.Hour})
	run(t, b.Ctx, r)
	listener := b.awaitListening(t, r)

	b.Complete(t, "s", "first", "{}")
	oncetest.Eventually(t, 5*time.Second, "notified delivery", func() bool { return b.outboxLen(t) == 0 })

	var killed int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&killed))
	require.Equal(t, 1, killed)
	oncetest.Eventually(t, 5*time.Second, "relay reconnected", func() bool {
		return testutil.ToFloat64(r.metrics.errors.WithLabelValues(stageListen)) >= 1
	})
	// Once the relay listens on a new connection, a write is delivered
	// because of its notification.
	b.awaitListeningAgain(t, r, listener)
	b.Complete(t, "s", "after", "{}")
	oncetest.Eventually(t, 5*time.Second, "notified delivery after the reconnect", func() bool { return b.outboxLen(t) == 0 })
	b.RequireConverged(t)
}

func TestPoisonEventIsParkedAndDoesNotBlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A row the cache cannot encode: a response status out of range.
	_, err := b.Pool.Exec(b.Ctx, `
		INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
			VALUES ('s', 'poison', 'completed', 2, 'v1:fp', 1000, '{}', now() + interval '1 hour');
		INSERT INTO outbox (scope, key, version) VALUES ('s', 'poison', 2)`)
	require.NoError(t, err)
	for i := range 5 {
		b.Complete(t, "s", fmt.Sprintf("k%d", i), "{}")
	}
	r := b.relay(t, Config{MaxAttempts: 3})
	n, err := r.Drain(b.Ctx)
	require.NoError(t, err)
	require.Equal(t, 10, n)

	var attempts int
	var lastError string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT attempts, last_error FROM outbox WHERE key = 'poison' AND parked_at IS NOT NULL`).
		Scan(&attempts, &lastError))
	require.Equal(t, 3, attempts)
	require.Contains(t, lastError, "out of range")
	require.Equal(t, 1, b.outboxLen(t))
	require.EqualValues(t, 1, testutil.ToFloat64(r.metrics.parked))
	require.EqualValues(t, 3, testutil.ToFloat64(r.metrics.errors.WithLabelValues(stageEvent)))

	n, err = r.Drain(b.Ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a parked event is not taken again")
}

// TestFullBatchOverlapsTheNext holds every batch after its Redis push until
// another batch has reached that point too: with InFlight 2 a full batch
// lets a second one be taken and pushed meanwhile, so the drain completes;
// one at a time, the first batch gives up waiting and the drain fails.
func TestFullBatchOverlapsTheNext(t *testing.T) {
	t.Parallel()
	for _, inFlight := range []int{2, 1} {
		t.Run(fmt.Sprintf("in_flight=%d", inFlight), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for i := range 15 {
				b.Complete(t, "s", fmt.Sprintf("k%d", i), "{}") // 30 events
			}
			r := b.relay(t, Config{BatchSize: 10, InFlight: inFlight})
			var pushed atomic.Int32
			overlapped := make(chan struct{})
			r.afterPush = func() error {
				if pushed.Add(1) == 2 {
					close(overlapped)
				}
				select {
				case <-overlapped:
					return nil
				case <-time.After(2 * time.Second):
					return errors.New("no other batch was under way")
				}
			}
			n, err := r.Drain(b.Ctx)
			if inFlight == 1 {
				require.ErrorContains(t, err, "no other batch was under way")
				return
			}
			require.NoError(t, err)
			require.Equal(t, 30, n)
			require.Zero(t, b.outboxLen(t))
			b.RequireConverged(t)
		})
	}
}

// TestNotificationDuringABatchIsServedAtOnce holds the first batch after its
// Redis push and writes another event: a second worker, woken by its
// NOTIFY, delivers it meanwhile (polling is off). One worker at a time would
// deliver it only after the held batch.
func TestNotificationDuringABatchIsServedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{PollInterval: time.Hour})
	held, release := make(chan struct{}), make(chan struct{})
	var pushed atomic.Int32
	r.afterPush = func() error {
		if pushed.Add(1) == 1 { // the first batch waits; the others pass
			close(held)
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		return nil
	}
	run(t, b.Ctx, r)
	b.awaitListening(t, r)
	first, second := keystate.Ref{Scope: "s", Key: "first"}, keystate.Ref{Scope: "s", Key: "second"}
	_, err := b.Store.Claim(b.Ctx, b.Pool, first, "v1:fp", owner, time.Minute)
	require.NoError(t, err)
	<-held
	_, err = b.Store.Claim(b.Ctx, b.Pool, second, "v1:fp", owner, time.Minute)
	require.NoError(t, err)
	oncetest.Eventually(t, 5*time.Second, "the second event delivered while the first batch is held", func() bool {
		return b.outboxLen(t) == 1
	})
	_, found, err := b.Cache.Read(b.Ctx, second)
	require.NoError(t, err)
	require.True(t, found)
	var left string
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT key FROM outbox`).Scan(&left))
	require.Equal(t, "first", left, "the held batch has not committed")
	close(release)
	oncetest.Eventually(t, 5*time.Second, "outbox drained", func() bool { return b.outboxLen(t) == 0 })
	b.RequireConverged(t)
}

// TestStartStop: Start runs the relay in the background, Stop ends it and
// returns once it has stopped (goleak, in TestMain, finds any goroutine
// left), a second Stop and a Stop without Start do nothing, and a stopped
// relay starts again.
func TestStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{PollInterval: 50 * time.Millisecond})
	r.Stop() // never started
	for round := range 2 {
		require.NoError(t, r.Start(b.Ctx))
		require.NoError(t, r.Start(b.Ctx), "starting a running relay does nothing")
		<-r.Started()
		b.Complete(t, "s", fmt.Sprintf("started-%d", round), "{}")
		oncetest.Eventually(t, 5*time.Second, "the started relay delivers", func() bool { return b.outboxLen(t) == 0 })
		stopped := r.Stopped()
		r.Stop()
		select {
		case <-stopped:
		default:
			t.Fatal("Stop returned before the relay stopped")
		}
		r.Stop()
	}
	b.RequireConverged(t)
}

func TestShutdownLeavesNoEventBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{BatchSize: 10})
	ctx, cancel := context.WithCancel(b.Ctx)
	entered := make(chan struct{})
	var once sync.Once
	r.afterPush = func() error {
		once.Do(func() { close(entered); cancel() }) // SIGTERM while a batch is in flight
		return nil
	}
	for i := range 50 {
		b.Complete(t, "s", fmt.Sprintf("k%d", i), "{}")
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-entered
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("relay did not stop")
	}
	// The batches under way (the one that saw the stop, and at most
	// InFlight-1 others) committed; nothing else was taken.
	published := int(testutil.ToFloat64(r.metrics.published))
	require.Contains(t, []int{10, 20}, published, "only the batches under way at the stop were delivered")
	require.Equal(t, 100-published, b.outboxLen(t), "every other event is still in the outbox")
}

// TestPostgresConnectionsKilledMidStreamLoseNothing cuts every connection
// the relay holds (its pool and its LISTEN), again and again, while events
// are written, as a Postgres restart or failover would.
func TestPostgresConnectionsKilledMidStreamLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, Config{PollInterval: 50 * time.Millisecond, BatchSize: 5})
	run(t, b.Ctx, r)
	url := b.Pool.Config().ConnString()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	writer := oncetest.Pool(t, url+sep+"application_name=writer")

	ctx, stop := context.WithTimeout(b.Ctx, 2*time.Second)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("k%d", i)
			if _, err := b.Store.Claim(ctx, writer, keystate.Ref{Scope: "s", Key: key}, "v1:fp", owner, time.Minute); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
		}
	})
	var kills int
	for ctx.Err() == nil {
		time.Sleep(150 * time.Millisecond) // the pace of the cuts, not a wait for an event
		var n int
		// Every backend of this database except the writer's and this one.
		err := writer.QueryRow(b.Ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND application_name <> 'writer'`).Scan(&n)
		require.NoError(t, err)
		kills += n
	}
	wg.Wait()
	require.Positive(t, kills)
	oncetest.Eventually(t, 15*time.Second, "outbox drained after the cuts", func() bool {
		var n int
		return writer.QueryRow(b.Ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
	oncetest.RequireConverged(t, b.Ctx, writer, b.Cache, "%")
	require.Positive(t, testutil.ToFloat64(r.metrics.errors.WithLabelValues(stageListen)))
}

// TestRecoveryIsLoggedOnce: while Redis is down every retry warns; once it is
// back, one info line says the relay recovered, after how many failures.
func TestRecoveryIsLoggedOnce(t *testing.T) {
	t.Parallel()
	proxy, redisURL := oncetest.NewFaultProxyFor(t, oncetest.RedisURL(t))
	b := setup(t, oncetest.OnRedis(oncetest.RedisClient(t, redisURL)))
	var logs oncetest.LogBuffer
	r := b.relay(t, Config{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	run(t, b.Ctx, r)

	proxy.SetMode(oncetest.Reset)
	b.Complete(t, "s", "during", "{}")
	oncetest.Eventually(t, 10*time.Second, "retries warned", func() bool {
		return strings.Count(logs.String(), "relay batch failed, retrying") >= 2
	})
	require.NotContains(t, logs.String(), "recovered")

	proxy.SetMode(oncetest.Pass)
	oncetest.Eventually(t, 15*time.Second, "backlog drained after Redis returned", func() bool { return b.outboxLen(t) == 0 })
	oncetest.Eventually(t, 5*time.Second, "recovery logged", func() bool {
		return strings.Contains(logs.String(), "recovered after")
	})
	b.Complete(t, "s", "after", "{}")
	oncetest.Eventually(t, 10*time.Second, "next event delivered", func() bool { return b.outboxLen(t) == 0 })
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "relay delivering again: recovered after"), out)
	require.Regexp(t, `level=INFO msg="relay delivering again: recovered after \d+ failures for [0-9.]+m?s" failures=\d+`, out)
}
