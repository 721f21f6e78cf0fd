package onceonly_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	prefix string
	engine *onceonly.Engine
	reg    *prometheus.Registry
}

type setupOpts struct {
	rdb     redis.UniversalClient // nil: the shared test Redis
	lease   time.Duration
	noRedis bool
}

func setup(t *testing.T, opts setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), reg: prometheus.NewRegistry()}
	switch {
	case opts.noRedis:
	case opts.rdb != nil:
		b.rdb, b.prefix = opts.rdb, oncetest.KeyPrefix(t, opts.rdb)
	default:
		b.rdb, b.prefix = oncetest.Redis(t)
	}
	b.engine = b.newEngine(t, opts.lease, b.reg)
	return b
}

func (b *testBundle) newEngine(t *testing.T, lease time.Duration, reg prometheus.Registerer) *onceonly.Engine {
	t.Helper()
	e, err := onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, LeaseTimeout: lease,
		MaxCachedBody: 1024, Registerer: reg,
		// These tests are of the two-phase path's claims, leases and
		// recovery from the start; onecommit_test.go and single_test.go
		// test the default, which begins as one commit.
		TwoPhase: true,
	})
	require.NoError(t, err)
	t.Cleanup(e.Close) // its lease renewals stop with the test
	return e
}

// payment is a handler that records one row per execution.
func payment(status int, body string) onceonly.Handler {
	return func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, 'm', 'k', 100, 'usd', 'c', 'succeeded')`); err != nil {
			return onceonly.Result{}, err
		}
		return onceonly.Result{Status: status, ContentType: "application/json", Body: []byte(body)}, nil
	}
}

func (b *testBundle) payments(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments`).Scan(&n))
	return n
}

func (b *testBundle) keyStatus(t *testing.T, key string) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `SELECT status FROM idempotency_keys WHERE key = $1`, key).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "absent"
	}
	require.NoError(t, err)
	return s
}

func (b *testBundle) outcomes(outcome string) float64 {
	mfs, _ := b.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "onceonly_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		first, err := b.engine.Do(b.ctx, "m", "k1", []byte("p"), payment(201, `{"id":1}`))
		require.NoError(t, err)
		require.False(t, first.Replayed)
		require.Equal(t, 201, first.Status)

		for range 3 {
			again, err := b.engine.Do(b.ctx, "m", "k1", []byte("p"), payment(201, `{"id":2}`))
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, first.Result, again.Result)
		}
		require.Equal(t, 1, b.payments(t))
		require.Equal(t, 3.0, b.outcomes("replayed_cache"), "replays come from Redis after the write-through")
	})
}

func TestDoRefusesReuseWithAnotherPayload(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		_, err := b.engine.Do(b.ctx, "m", "k", []byte("p1"), payment(201, `{}`))
		require.NoError(t, err)
		ran := false
		_, err = b.engine.Do(b.ctx, "m", "k", []byte("p2"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			ran = true
			return onceonly.Result{}, nil
		})
		require.ErrorIs(t, err, onceonly.ErrKeyReused)
		require.False(t, ran)

		// Same answer when Redis lost the key: Postgres decides.
		require.NoError(t, b.rdb.Del(b.ctx, b.prefix+"m:k").Err())
		_, err = b.engine.Do(b.ctx, "m", "k", []byte("p2"), payment(201, `{}`))
		require.ErrorIs(t, err, onceonly.ErrKeyReused)
		require.Equal(t, 1, b.payments(t))
	})
}

func TestScopesNeverMeet(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		for _, scope := range []string{"m1", "m2"} {
			out, err := b.engine.Do(b.ctx, scope, "k", []byte("p"), payment(201, scope))
			require.NoError(t, err)
			require.False(t, out.Replayed)
		}
		require.Equal(t, 2, b.payments(t))
	})
}

func TestInFlightDuplicateGetsRetryAfter(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Redis", "RedisCluster", "PostgresOnly"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts := setupOpts{lease: 30 * time.Second}
			switch name {
			case "RedisCluster":
				opts.rdb = oncetest.RedisClusterClient(t)
			case "PostgresOnly":
				opts.noRedis = true
			}
			b := setup(t, opts)
			started, release := make(chan struct{}), make(chan struct{})
			done := make(chan error)
			go func() {
				_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
					close(started)
					<-release
					return payment(201, "{}")(ctx, tx)
				})
				done <- err
			}()
			<-started
			_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
			inFlight, ok := onceonly.IsInFlight(err)
			require.True(t, ok, "got %v", err)
			require.Greater(t, inFlight.LeaseRemaining, 20*time.Second)
			require.Equal(t, onceonly.MaxInFlightRetry, inFlight.RetryAfter, "a retry comes back within a second, whatever the lease")
			close(release)
			require.NoError(t, <-done)
			require.Equal(t, 1, b.payments(t))
		})
	}
}

func TestFailuresAreRetryable(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		// A 5xx result is returned but not stored; its writes roll back.
		out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(502, `{"error":"gateway"}`))
		require.NoError(t, err)
		require.Equal(t, 502, out.Status)
		require.Equal(t, 0, b.payments(t))
		require.Equal(t, "failed", b.keyStatus(t, "k"))

		// A handler error fails the key too.
		boom := errors.New("boom")
		_, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			return onceonly.Result{}, boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, "failed", b.keyStatus(t, "k"))

		// So does a panic, which goes on to the caller.
		require.Panics(t, func() {
			_, _ = b.engine.Do(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				_, _ = payment(201, "{}")(ctx, tx)
				panic("handler bug")
			})
		})
		require.Equal(t, "failed", b.keyStatus(t, "k"))
		require.Equal(t, 0, b.payments(t))

		out, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"ok":true}`))
		require.NoError(t, err)
		require.False(t, out.Replayed)
		require.Equal(t, 1, b.payments(t))
	})
}

func TestDeterministic4xxIsStored(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(402, `{"error":"declined"}`))
		require.NoError(t, err)
		out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
		require.NoError(t, err)
		require.True(t, out.Replayed)
		require.Equal(t, 402, out.Status)
		require.Equal(t, 1, b.payments(t))
	})
}

func TestLargeBodyIsReplayedFromPostgres(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		large := `{"blob":"` + strings.Repeat("x", 4000) + `"}`
		_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, large))
		require.NoError(t, err)
		raw, err := b.rdb.Get(b.ctx, b.prefix+"m:k").Result()
		require.NoError(t, err)
		require.Less(t, len(raw), 64, "Redis keeps only a marker")
		out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
		require.NoError(t, err)
		require.True(t, out.Replayed)
		require.Equal(t, large, string(out.Body))
		require.Equal(t, 1.0, b.outcomes("replayed_db"))
	})
}

// TestRedisLossIsHarmless: with the cache flushed, or its server gone, the
// engine answers from Postgres: no duplicate, same replay.
func TestRedisLossIsHarmless(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	rdb := oncetest.RedisClient(t, srv.URL())
	b := setup(t, setupOpts{rdb: rdb})
	first, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"n":1}`))
	require.NoError(t, err)

	require.NoError(t, rdb.FlushAll(b.ctx).Err())
	again, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"n":2}`))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Result, again.Result)
	oncetest.Eventually(t, time.Second, "read-repair of the cache", func() bool {
		e, found, _ := cache.New(rdb, cache.Options{Prefix: b.prefix}).Read(b.ctx, keystate.Ref{Scope: "m", Key: "k"})
		return found && e.State == keystate.Completed
	})

	srv.Stop()
	again, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{"n":3}`))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Result, again.Result)
	out, err := b.engine.Do(b.ctx, "m", "k2", []byte("p"), payment(201, `{"n":4}`))
	require.NoError(t, err, "first executions go on without Redis")
	require.False(t, out.Replayed)
	require.Equal(t, 2, b.payments(t))
	require.Positive(t, b.sum(t, "onceonly_redis_fallback_total"))
}

// sum adds up every series of a counter family.
func (b *testBundle) sum(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// TestCrashedClaimRecoversAfterLease: a claim whose process died (no
// complete, no fail) blocks its key until the lease ends; then a retry runs
// exactly once.
func TestCrashedClaimRecoversAfterLease(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb, lease: 600 * time.Millisecond})
		// The crashed process: a provisional claim in Redis and a committed claim in
		// Postgres, then nothing.
		res, err := b.engine.Do(b.ctx, "m", "warmup", []byte("p"), payment(201, "{}"))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		_, err = b.pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
			VALUES ('m', 'k', 'in_progress', 1, $1, gen_random_uuid(), now() + interval '600 milliseconds', now() + interval '1 hour')`,
			onceonly.PayloadFingerprint([]byte("p")))
		require.NoError(t, err)

		_, err = b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
		_, inFlight := onceonly.IsInFlight(err)
		require.True(t, inFlight, "got %v", err)

		// The lease ends in Postgres, and in Redis, where the in-flight
		// answer left a claim.
		ref := keystate.Ref{Scope: "m", Key: "k"}
		oncetest.AwaitLeaseOver(t, b.ctx, b.pool, ref, 0)
		oncetest.AwaitCacheLeaseOver(t, b.ctx, cache.New(rdb, cache.Options{Prefix: b.prefix}), ref)
		var wg sync.WaitGroup
		var executed atomic.Int32
		for range 10 {
			wg.Go(func() {
				out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
				if err == nil && !out.Replayed {
					executed.Add(1)
				}
			})
		}
		wg.Wait()
		require.Equal(t, int32(1), executed.Load())
		require.Equal(t, 2, b.payments(t))
		require.Equal(t, "completed", b.keyStatus(t, "k"))
	})
}

// TestTakenOverWorkerCannotCommit: a slow worker whose lease was taken over
// (its heartbeat stopped reaching Postgres) tries to commit while the new
// owner is still running: its business write is rolled back, and only the
// new owner's commits.
func TestTakenOverWorkerCannotCommit(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb, lease: time.Hour})
		b.takeOver(t, func(who string, g *gate) error {
			out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				g.wait()
				return payment(201, `{"who":"`+who+`"}`)(ctx, tx)
			})
			if err == nil && out.Replayed {
				err = errors.New("the takeover was answered with a replay")
			}
			return err
		})
		out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, `{}`))
		require.NoError(t, err)
		require.Equal(t, `{"who":"new"}`, string(out.Body)) //nolint:testifylint // encoded-compare: a replay is the stored body byte for byte, not just equal JSON
	})
}

// takeOver plays a takeover of key "k" in scope "m", whose executions
// run(who, g) makes: a handler that waits at g, then writes one payment
// and answers {"who":who}. The slow one holds the key at its gate while
// its lease is ended and Redis forgets the key; the new one takes the key
// over and waits at its own gate; the slow one goes on and must lose
// (ErrLeaseLost, its write rolled back), then the new one commits.
func (b *testBundle) takeOver(t *testing.T, run func(who string, g *gate) error) {
	t.Helper()
	slowGate, newGate := newGate(t), newGate(t)
	slow, fresh := make(chan error), make(chan error)
	go func() { slow <- run("slow", slowGate) }()
	<-slowGate.inside

	_, err := b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET lease_expires_at = now() - interval '1s'`)
	require.NoError(t, err)
	require.NoError(t, b.rdb.Del(b.ctx, b.prefix+"m:k").Err())
	go func() { fresh <- run("new", newGate) }()
	<-newGate.inside

	slowGate.open()
	require.ErrorIs(t, <-slow, onceonly.ErrLeaseLost, "the old owner commits while the new one runs")
	require.Equal(t, 0, b.payments(t), "the old owner's write rolled back")
	newGate.open()
	require.NoError(t, <-fresh)
	require.Equal(t, 1, b.payments(t))
}

// gate holds a handler until the test opens it; inside is closed when the
// handler arrives.
type gate struct {
	inside, proceed chan struct{}
	open            func()
}

func newGate(t *testing.T) *gate {
	g := &gate{inside: make(chan struct{}), proceed: make(chan struct{})}
	g.open = sync.OnceFunc(func() { close(g.proceed) })
	t.Cleanup(g.open) // a failing assertion must not leave a handler hanging
	return g
}

// wait tells the test the handler arrived, and waits for the gate to open.
func (g *gate) wait() {
	close(g.inside)
	<-g.proceed
}

// TestHeartbeatKeepsSlowExecutionAlive: a live execution longer than its
// lease is never taken over.
func TestHeartbeatKeepsSlowExecutionAlive(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		// A renewal is sent a third of the way into the lease and has half
		// of it to land; under a loaded CI (race detector, packages in
		// parallel) the 100 ms a 300 ms lease left was too little, and the
		// 500 ms of a 1 s lease too (a renewal failed, the execution was
		// stopped, and a duplicate took the key over).
		const lease = 3 * time.Second
		b := setup(t, setupOpts{rdb: rdb, lease: lease})
		inside, release := make(chan struct{}), make(chan struct{})
		done := make(chan error)
		go func() {
			_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				close(inside)
				select { // held for more than three leases
				case <-release:
				case <-ctx.Done():
					return onceonly.Result{}, ctx.Err()
				}
				return payment(201, "{}")(ctx, tx)
			})
			done <- err
		}()
		<-inside
		for began := time.Now(); time.Since(began) < 3*lease+100*time.Millisecond; {
			time.Sleep(100 * time.Millisecond) // the pace of the duplicates over three leases, not a wait for an event
			_, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
			_, inFlight := onceonly.IsInFlight(err)
			require.True(t, inFlight, "got %v", err)
		}
		close(release)
		require.NoError(t, <-done)
		require.Equal(t, 1, b.payments(t))
	})
}

func TestCanceledRequestLeavesNothingClaimed(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		ctx, cancel := context.WithCancel(b.ctx)
		_, err := b.engine.Do(ctx, "m", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			cancel()
			<-ctx.Done()
			return onceonly.Result{}, ctx.Err()
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, "failed", b.keyStatus(t, "k"))
		out, err := b.engine.Do(b.ctx, "m", "k", []byte("p"), payment(201, "{}"))
		require.NoError(t, err)
		require.False(t, out.Replayed)
	})
}

func TestInvalidKeyAndScope(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, key := range []string{"", "has space", strings.Repeat("k", 256), "tab\t", "é"} {
		_, err := b.engine.Do(b.ctx, "m", key, nil, payment(201, "{}"))
		require.ErrorIs(t, err, onceonly.ErrInvalidKey, "%q", key)
	}
	for _, scope := range []string{"", "a:b"} {
		_, err := b.engine.Do(b.ctx, scope, "k", nil, payment(201, "{}"))
		require.ErrorIs(t, err, onceonly.ErrInvalidScope, "%q", scope)
	}
	require.Equal(t, 0, b.payments(t))
	require.Equal(t, "absent", b.keyStatus(t, "k"))
}

// TestScopeWithNULOrInvalidUTF8IsInvalid: a scope Postgres text cannot
// hold (NUL, invalid UTF-8) is refused as invalid before anything runs —
// Do returns ErrInvalidScope, not ErrUnavailable (which a broker would
// retry forever); Settle dead-letters it as invalid; the middleware
// answers 401, not 503.
func TestScopeWithNULOrInvalidUTF8IsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") })
	for _, scope := range []string{"nul\x00", "a\x00b", "\xff", "bad\xc3(", "a:b"} {
		_, err := b.engine.Do(b.ctx, scope, "k", []byte("p"), payment(201, "{}"))
		require.ErrorIs(t, err, onceonly.ErrInvalidScope, "Do, scope %q", scope)
		require.NotErrorIs(t, err, onceonly.ErrUnavailable, "Do, scope %q", scope)

		s := onceonly.Settle(b.engine.Do(b.ctx, scope, "k", []byte("p"), payment(201, "{}")))
		require.Equal(t, onceonly.DeadLetter, s.Disposition, "Settle, scope %q", scope)
		require.Equal(t, onceonly.ReasonInvalid, s.Reason, "Settle, scope %q", scope)

		mw := b.engine.Middleware(onceonly.MiddlewareOptions{Scope: func(*http.Request) (string, error) { return scope, nil }})(next)
		req := httptest.NewRequestWithContext(b.ctx, http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header.Set(onceonly.HeaderKey, "k")
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		require.Equal(t, http.StatusUnauthorized, rec.Code, "middleware, scope %q: %s", scope, rec.Body)
	}
	require.Equal(t, 0, b.payments(t))
}

// listen opens a LISTEN connection on the test's database and returns a
// function that reports whether a notification arrives within wait.
func (b *testBundle) listen(t *testing.T) func(wait time.Duration) bool {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	_, err = conn.Exec(b.ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	return func(wait time.Duration) bool {
		ctx, cancel := context.WithTimeout(b.ctx, wait)
		defer cancel()
		got := false
		for {
			if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
				return got
			}
			got = true
		}
	}
}

// TestDeferredRelayNotify: by default the engine's transactions send no
// NOTIFY while the write-through lands, and wake the relay after the commit
// when it does not; with NotifyInTransaction they notify at commit.
func TestDeferredRelayNotify(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	b := setup(t, setupOpts{rdb: oncetest.RedisClient(t, srv.URL())})
	e := b.engine
	notified := b.listen(t)

	_, err := e.Do(b.ctx, "m", "quiet", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.False(t, notified(300*time.Millisecond), "written through: no NOTIFY")
	var events int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE key = 'quiet'`).Scan(&events))
	require.Equal(t, 2, events, "the events are written all the same")

	srv.Stop()
	_, err = e.Do(b.ctx, "m", "loud", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.True(t, notified(2*time.Second), "the write-through failed: the relay is woken")

	// Asked to, the engine notifies inside its transactions.
	inTx, err := onceonly.New(onceonly.Config{Pool: b.pool, TwoPhase: true, Tuning: onceonly.Tuning{NotifyInTransaction: true}})
	require.NoError(t, err)
	t.Cleanup(inTx.Close)
	_, err = inTx.Do(b.ctx, "m", "in-tx", []byte("p"), payment(201, `{}`))
	require.NoError(t, err)
	require.True(t, notified(2*time.Second))
}
