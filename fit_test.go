package onceonly_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// answer is what a client read.
type answer struct {
	status int
	header http.Header
	body   string
}

// post sends a JSON POST with an idempotency key to url.
func post(ctx context.Context, t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := send(ctx, url, key, body)
	require.NoError(t, err)
	return a
}

// send is post for goroutines, which must not stop the test.
func send(ctx context.Context, url, key, body string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(onceonly.HeaderKey, key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, string(raw)}, err
}

// sendAsync sends in a goroutine; the answer arrives on the channel.
func sendAsync(t *testing.T, ctx context.Context, url, key, body string, answers chan<- answer) {
	t.Helper()
	go func() {
		a, err := send(ctx, url, key, body)
		if err != nil {
			t.Error(err)
		}
		answers <- a
	}()
}

// counting is a handler that answers 201 with the number of its run.
func counting(runs *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"run":%d}`, n)
	})
}

func tenant(*http.Request) (string, error) { return "tenant", nil }

// TestMiddlewareFingerprintCoversQuery: the query is part of the request
// (POST /x?dry_run=true is another request than POST /x), its parameter
// order is not; a body naming a member twice is 400 invalid_json and leaves
// no key row.
func TestMiddlewareFingerprintCoversQuery(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var runs atomic.Int32
	srv := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: tenant})(counting(&runs)))
	t.Cleanup(srv.Close)

	require.Equal(t, http.StatusCreated, post(b.ctx, t, srv.URL+"/x?a=1&b=2", "q-1", `{"n":1}`).status)
	again := post(b.ctx, t, srv.URL+"/x?b=2&a=1", "q-1", `{ "n" : 1 }`)
	require.Equal(t, "true", again.header.Get(onceonly.HeaderReplayed), "parameter order does not matter")
	require.Equal(t, http.StatusUnprocessableEntity, post(b.ctx, t, srv.URL+"/x?a=1&b=2&dry_run=true", "q-1", `{"n":1}`).status)
	require.Equal(t, http.StatusUnprocessableEntity, post(b.ctx, t, srv.URL+"/x", "q-1", `{"n":1}`).status)
	require.EqualValues(t, 1, runs.Load())

	dup := post(b.ctx, t, srv.URL+"/x", "q-dup", `{"amount":1,"amount":1000}`)
	require.Equal(t, http.StatusBadRequest, dup.status)
	require.Contains(t, dup.body, `"code":"invalid_json"`)
	require.Equal(t, "absent", b.keyStatus(t, "q-dup"))
	require.Equal(t, http.StatusBadRequest, post(b.ctx, t, srv.URL+"/x?a=%zz", "q-bad", `{}`).status, "a malformed query")
}

// TestMiddlewareHonoursLegacyFingerprints: a key stored under the version 1
// fingerprint (no query) is replayed to its request, from Redis and from
// Postgres, and still refuses another payload, until it expires.
func TestMiddlewareHonoursLegacyFingerprints(t *testing.T) {
	t.Parallel()
	// A Redis of its own: the test flushes it, and the shared one holds
	// the keys of the tests running beside it (other packages' too).
	own := oncetest.NewRedisServer(t)
	b := setup(t, setupOpts{rdb: oncetest.RedisClient(t, own.URL())})
	var runs atomic.Int32
	srv := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: tenant})(counting(&runs)))
	t.Cleanup(srv.Close)

	// A key completed by the previous version: its fingerprint is v1.
	canonical, err := onceonly.CanonicalJSON([]byte(`{"n":1}`))
	require.NoError(t, err)
	v1 := onceonly.LegacyFingerprint(http.MethodPost, "/x", canonical)
	require.True(t, strings.HasPrefix(v1, "v1:"))
	store := outbox.New(outbox.Config{})
	ref := keystate.Ref{Scope: "tenant", Key: "old"}
	claim, err := store.Claim(b.ctx, b.pool, ref, v1, keystate.NewOwner(), time.Minute)
	require.NoError(t, err)
	require.True(t, claim.Claimed)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = store.Complete(b.ctx, tx, ref, claim.Key.Owner, keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"run":"v1"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))

	fromPostgres := post(b.ctx, t, srv.URL+"/x", "old", `{"n":1}`)
	require.Equal(t, http.StatusCreated, fromPostgres.status)
	require.JSONEq(t, `{"run":"v1"}`, fromPostgres.body)
	fromRedis := post(b.ctx, t, srv.URL+"/x", "old", `{"n": 1}`)
	require.JSONEq(t, `{"run":"v1"}`, fromRedis.body)
	require.Equal(t, "true", fromRedis.header.Get(onceonly.HeaderReplayed))
	require.Equal(t, http.StatusUnprocessableEntity, post(b.ctx, t, srv.URL+"/x", "old", `{"n":2}`).status)
	require.NoError(t, b.rdb.FlushDB(b.ctx).Err())
	require.Equal(t, http.StatusUnprocessableEntity, post(b.ctx, t, srv.URL+"/x", "old", `{"n":2}`).status, "Postgres refuses too")
	require.Zero(t, runs.Load(), "the handler never ran for the old key")
}

// TestMiddlewareFingerprintHook: a custom fingerprint decides what a
// request is; an *HTTPError from it is the answer.
func TestMiddlewareFingerprintHook(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var runs atomic.Int32
	byPath := func(r *http.Request, _ []byte) (string, error) {
		if strings.HasPrefix(r.URL.Path, "/refuse") {
			return "", &onceonly.HTTPError{Status: http.StatusBadRequest, Code: "no_way", Message: "Refused."}
		}
		return "path:" + r.URL.Path, nil
	}
	srv := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: tenant, Fingerprint: byPath})(counting(&runs)))
	t.Cleanup(srv.Close)
	require.Equal(t, http.StatusCreated, post(b.ctx, t, srv.URL+"/a", "h-1", `{"n":1}`).status)
	require.Equal(t, "true", post(b.ctx, t, srv.URL+"/a", "h-1", `not json at all`).header.Get(onceonly.HeaderReplayed), "the hook ignores the body")
	require.Equal(t, http.StatusUnprocessableEntity, post(b.ctx, t, srv.URL+"/b", "h-1", `{"n":1}`).status)
	refused := post(b.ctx, t, srv.URL+"/refuse", "h-2", `{}`)
	require.Equal(t, http.StatusBadRequest, refused.status)
	require.Contains(t, refused.body, `"code":"no_way"`)
	require.EqualValues(t, 1, runs.Load())
}

// TestMiddlewareWait: duplicates that arrive while the first request runs
// wait for its answer and get it replayed, instead of a 409; the handler
// runs once. With Redis and without (Postgres answers then). Past the
// bound, a duplicate gets the 409 with Retry-After.
func TestMiddlewareWait(t *testing.T) {
	t.Parallel()
	for _, noRedis := range []bool{false, true} {
		t.Run(fmt.Sprintf("noRedis=%v", noRedis), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{noRedis: noRedis})
			var runs atomic.Int32
			release := make(chan struct{})
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/slow" {
					<-release
				}
				counting(&runs).ServeHTTP(w, r)
			})
			waiting := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: tenant, Wait: 10 * time.Second})(slow))
			t.Cleanup(waiting.Close)
			impatient := httptest.NewServer(b.engine.Middleware(onceonly.MiddlewareOptions{Scope: tenant, Wait: 200 * time.Millisecond})(slow))
			t.Cleanup(impatient.Close)
			var releaseOnce sync.Once
			letGo := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(letGo) // before the servers close: a failed test leaves no handler waiting

			first := make(chan answer, 1)
			sendAsync(t, b.ctx, waiting.URL+"/slow", "w-1", `{"n":1}`, first)
			require.Eventually(t, func() bool { return b.keyStatus(t, "w-1") == "in_progress" }, 5*time.Second, 5*time.Millisecond)

			start := time.Now()
			timedOut := post(b.ctx, t, impatient.URL+"/slow", "w-1", `{"n":1}`)
			require.Equal(t, http.StatusConflict, timedOut.status, "past its bound a duplicate gets the 409")
			require.NotEmpty(t, timedOut.header.Get("Retry-After"))
			require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "it waited its bound")

			const duplicates = 8
			answers := make(chan answer, duplicates)
			for range duplicates {
				sendAsync(t, b.ctx, waiting.URL+"/slow", "w-1", `{"n":1}`, answers)
			}
			oncetest.Eventually(t, 10*time.Second, "the duplicates waiting", func() bool {
				return b.sum(t, "onceonly_waits_total") == 1+duplicates // the impatient one, then these
			})
			letGo()
			want := <-first
			require.Equal(t, http.StatusCreated, want.status)
			for range duplicates {
				got := <-answers
				require.Equal(t, want.status, got.status)
				require.Equal(t, want.body, got.body)
				require.Equal(t, "true", got.header.Get(onceonly.HeaderReplayed))
			}
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

// ledger inserts one ledger row per execution, in tx.
func ledger(ctx context.Context, tx pgx.Tx, key string) (onceonly.Result, error) {
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
		VALUES (gen_random_uuid()::text, 'm', $1, 100, 'usd', 'c', 'succeeded') RETURNING length(id)`, key).Scan(&id); err != nil {
		return onceonly.Result{}, err
	}
	return onceonly.Result{Status: 201, ContentType: "application/json", Body: []byte(`{"ok":true}`)}, nil
}

// TestDoTxHandlerCannotEndItsSavepoint: the savepoint DoTx hands its
// handler refuses Commit and Rollback (ErrCommitByHandler): a Commit
// would release it with the key in progress, so the caller's commit would
// keep the effect without the completion. Nested savepoints (Begin) still
// commit and roll back; the handler's writes and the key's completion
// commit with the caller.
func TestDoTxHandlerCannotEndItsSavepoint(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	ended := map[string]error{}
	_, err = b.engine.DoTx(b.ctx, tx, "tenant", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := ledger(ctx, tx, "handler"); err != nil {
			return onceonly.Result{}, err
		}
		ended["commit"], ended["rollback"] = tx.Commit(ctx), tx.Rollback(ctx)
		for _, c := range []struct {
			key string
			end func(pgx.Tx) error
		}{
			{"nested-kept", func(n pgx.Tx) error { return n.Commit(ctx) }},
			{"nested-undone", func(n pgx.Tx) error { return n.Rollback(ctx) }},
		} {
			nested, err := tx.Begin(ctx)
			if err != nil {
				return onceonly.Result{}, err
			}
			if _, err := ledger(ctx, nested, c.key); err != nil {
				return onceonly.Result{}, err
			}
			if err := c.end(nested); err != nil {
				return onceonly.Result{}, fmt.Errorf("%s: %w", c.key, err)
			}
		}
		return ledger(ctx, tx, "handler")
	})
	require.NoError(t, err)
	require.ErrorIs(t, ended["commit"], onceonly.ErrCommitByHandler)
	require.ErrorIs(t, ended["rollback"], onceonly.ErrCommitByHandler)
	require.Equal(t, "absent", b.keyStatus(t, "k"), "nothing is committed before the caller commits")
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, "completed", b.keyStatus(t, "k"))
	var written string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT string_agg(idempotency_key, ',' ORDER BY idempotency_key) FROM payments`).Scan(&written))
	require.Equal(t, "handler,handler,nested-kept", written, "the handler's writes and the nested savepoint it committed")
}

// TestDoTx: the key's claim and completion are part of the caller's
// transaction: committed with it, gone with its rollback, undone (and the
// transaction still usable) when the handler fails; a stored answer is
// replayed.
func TestDoTx(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	inTx := func(fn func(tx pgx.Tx) error, commit bool) {
		t.Helper()
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		require.NoError(t, fn(tx))
		if commit {
			require.NoError(t, tx.Commit(b.ctx))
		}
	}
	run := func(key string, payload string, fn onceonly.Handler, commit bool) (onceonly.Outcome, error) {
		var out onceonly.Outcome
		var err error
		inTx(func(tx pgx.Tx) error {
			out, err = b.engine.DoTx(b.ctx, tx, "tenant", key, []byte(payload), fn)
			return nil
		}, commit)
		return out, err
	}
	handler := func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) { return ledger(ctx, tx, "dotx") }

	_, err := run("rolled-back", "p", handler, false)
	require.NoError(t, err)
	require.Equal(t, "absent", b.keyStatus(t, "rolled-back"), "the caller's rollback takes the claim with it")

	out, err := run("k", "p", handler, true)
	require.NoError(t, err)
	require.False(t, out.Replayed)
	require.Equal(t, "completed", b.keyStatus(t, "k"))
	require.Equal(t, 1, b.payments(t))
	again, err := run("k", "p", handler, true)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, out.Body, again.Body)
	_, err = run("k", "other", handler, true)
	require.ErrorIs(t, err, onceonly.ErrKeyReused)
	require.Equal(t, 1, b.payments(t))

	boom := errors.New("boom")
	inTx(func(tx pgx.Tx) error {
		_, err := b.engine.DoTx(b.ctx, tx, "tenant", "fails", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
			if _, err := ledger(ctx, tx, "undone"); err != nil {
				return onceonly.Result{}, err
			}
			return onceonly.Result{}, boom
		})
		require.ErrorIs(t, err, boom)
		_, err = ledger(b.ctx, tx, "caller")
		return err
	}, true)
	require.Equal(t, "absent", b.keyStatus(t, "fails"), "the claim is undone")
	var undone, caller int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE idempotency_key = 'undone'), count(*) FILTER (WHERE idempotency_key = 'caller') FROM payments`).Scan(&undone, &caller))
	require.Equal(t, [2]int{0, 1}, [2]int{undone, caller}, "the handler's writes are undone, the caller's commit")

	// Every way out undoes the savepoint, also the one a handler error
	// that reads as a lost lease takes (a nested Run's, say), and that of
	// a handler whose caller canceled its context meanwhile: the caller
	// gets the handler's error and commits nothing of the key's.
	for i, c := range []struct {
		cancel bool
		err    error
	}{{false, fmt.Errorf("nested: %w", onceonly.ErrLeaseLost)}, {true, boom}} {
		key := fmt.Sprintf("lost-%d", i)
		ctx, cancel := context.WithCancel(b.ctx)
		inTx(func(tx pgx.Tx) error {
			_, err := b.engine.DoTx(ctx, tx, "tenant", key, []byte("p"), func(hctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				if _, err := ledger(hctx, tx, key); err != nil {
					return onceonly.Result{}, err
				}
				if c.cancel {
					cancel()
				}
				return onceonly.Result{}, c.err
			})
			require.ErrorIs(t, err, c.err)
			return nil
		}, true)
		cancel()
		require.Equal(t, "absent", b.keyStatus(t, key), "case %d: the claim is undone", i)
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments WHERE idempotency_key = $1`, key).Scan(&n))
		require.Zero(t, n, "case %d: the handler's writes are undone", i)
	}

	// A key another engine holds in flight is in flight for DoTx too.
	hold := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(b.ctx, "tenant", "held", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			<-hold
			return onceonly.Result{Status: 200}, nil
		})
		done <- err
	}()
	require.Eventually(t, func() bool { return b.keyStatus(t, "held") == "in_progress" }, 5*time.Second, 5*time.Millisecond)
	_, err = run("held", "p", handler, true)
	_, inFlight := onceonly.IsInFlight(err)
	require.True(t, inFlight, "got %v", err)
	close(hold)
	require.NoError(t, <-done)
}

// TestDoTxConcurrent hammers one key from many transactions: exactly one
// runs the handler and commits a ledger row; every other one, once the
// first commits, replays its answer.
func TestDoTxConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const workers, keys = 8, 20
	var wg sync.WaitGroup
	var executed, replayed atomic.Int32
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				key := fmt.Sprintf("c-%d", (k+w)%keys)
				tx, err := b.pool.Begin(b.ctx)
				if !assertNoError(t, err) {
					return
				}
				out, err := b.engine.DoTx(b.ctx, tx, "tenant", key, []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
					return ledger(ctx, tx, key)
				})
				if _, inFlight := onceonly.IsInFlight(err); inFlight {
					_ = tx.Rollback(b.ctx)
					continue
				}
				if !assertNoError(t, err) || !assertNoError(t, tx.Commit(b.ctx)) {
					return
				}
				if out.Replayed {
					replayed.Add(1)
				} else {
					executed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, keys, executed.Load(), "one execution per key")
	var rows, distinct int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM payments`).Scan(&rows, &distinct))
	require.Equal(t, [2]int{keys, keys}, [2]int{rows, distinct}, "one ledger row per key")
	t.Logf("%d executed, %d replayed", executed.Load(), replayed.Load())
}

// assertNoError reports a goroutine's error without stopping the test from
// another goroutine.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestCanceledClaimDoesNotStrand: a client that gives up while its claim
// is on the wire — committed in Postgres, the answer not yet back — leaves
// no key in progress: the key is failed at once (retryable), not held for
// its lease. Postgres is reached through a proxy that delays every answer,
// so each claim commits before its caller's deadline and answers after it.
func TestCanceledClaimDoesNotStrand(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = delayingProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port), 40*time.Millisecond)
	cfg.MinConns, cfg.MaxConns = 4, 4
	slow, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(slow.Close)
	warm := make([]*pgxpool.Conn, cfg.MaxConns) // every connection open before the deadlines start
	for i := range warm {
		warm[i], err = slow.Acquire(b.ctx)
		require.NoError(t, err)
	}
	for _, c := range warm {
		c.Release()
	}
	e, err := onceonly.New(onceonly.Config{Pool: slow, LeaseTimeout: time.Minute, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)

	const requests = 4 // one per connection
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(b.ctx, 60*time.Millisecond) // prepare and execute sent by 40ms, answered at 80ms
			defer cancel()
			_, err := e.Do(ctx, "tenant", fmt.Sprintf("cancel-%d", i), []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				return ledger(ctx, tx, "c")
			})
			if err == nil {
				t.Error("a request did not give up before its claim answered")
			}
		})
	}
	wg.Wait()
	var claimed, stranded int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'in_progress') FROM idempotency_keys`).Scan(&claimed, &stranded))
	require.Positive(t, claimed, "claims committed before their callers gave up")
	require.Zero(t, stranded, "keys left in progress by clients that gave up")
}

// delayingProxy forwards TCP connections to addr, holding every chunk the
// server sends for delay. It returns its host and port.
func delayingProxy(t *testing.T, addr string, delay time.Duration) (string, uint16) {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			var d net.Dialer
			server, err := d.DialContext(t.Context(), "tcp", addr)
			if err != nil {
				_ = client.Close()
				continue
			}
			conns.Go(func() {
				defer server.Close()
				_, _ = io.Copy(server, client)
			})
			conns.Go(func() {
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						time.Sleep(delay) // the injected latency, not a wait for an event
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	}()
	bound := netip.MustParseAddrPort(ln.Addr().String())
	return bound.Addr().String(), bound.Port()
}

// TestCacheAnnouncesSettlement: a key in progress that completes or goes is
// announced on its own channel, which is what wakes waiting requests; a
// claim or a renewal is not.
func TestCacheAnnouncesSettlement(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := oncetest.Context(t)
		c := cache.New(rdb, cache.Options{Prefix: oncetest.KeyPrefix(t, rdb)})
		for _, settle := range []keystate.Status{keystate.Completed, ""} {
			ref := keystate.Ref{Scope: "s", Key: "announce-" + string(settle)}
			ps, err := c.Watch(ctx, ref)
			require.NoError(t, err)
			running := keystate.Key{Ref: ref, Version: 1, Status: keystate.InProgress, Fingerprint: "f",
				Owner: keystate.NewOwner(), LeaseRemaining: time.Minute, ExpiresIn: time.Hour}
			_, err = c.Apply(ctx, running)
			require.NoError(t, err)
			running.Version = 2
			_, err = c.Apply(ctx, running)
			require.NoError(t, err)
			select {
			case m := <-ps.Channel():
				t.Fatalf("announced a key still in progress: %v", m)
			case <-time.After(50 * time.Millisecond):
			}
			settled := keystate.Key{Ref: ref, Version: 3, Status: keystate.Completed, Fingerprint: "f", ExpiresIn: time.Hour,
				Response: keystate.Response{Status: 200, Body: []byte("{}")}}
			if settle == "" {
				settled = keystate.Gone(ref, 3)
			}
			_, err = c.Apply(ctx, settled)
			require.NoError(t, err)
			select {
			case m := <-ps.Channel():
				require.Equal(t, c.Key(ref), m.Channel)
			case <-time.After(5 * time.Second):
				t.Fatalf("no announcement for %q", settle)
			}
			require.NoError(t, ps.Close())
		}
	})
}

// TestCompletionUnderRepeatableReadDefault: a database whose default
// isolation is REPEATABLE READ does not break executions: the lease
// renewals update the key row while the handler's transaction is open, and
// the completion, in that transaction, must see them (the engine's
// transactions are READ COMMITTED explicitly) instead of failing with
// 40001 and leaving a failed key. Each handler waits, its transaction open
// (its snapshot taken by its first write), until a renewal of its key has
// committed.
func TestCompletionUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	url := oncetest.DatabaseURL(t)
	admin := oncetest.Pool(t, url)
	_, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$`)
	require.NoError(t, err)
	pool := oncetest.Pool(t, url) // new connections take the setting
	var iso string
	require.NoError(t, pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&iso))
	require.Equal(t, "repeatable read", iso)

	// A renewal goes a third of the way into the lease, with half of it
	// left to land in on a loaded machine.
	const lease = 3 * time.Second
	e, err := onceonly.New(onceonly.Config{Pool: pool, LeaseTimeout: lease, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	leaseEnd := func(key string) (time.Time, error) {
		var end time.Time
		err := admin.QueryRow(ctx, `SELECT lease_expires_at FROM idempotency_keys WHERE scope = 'tenant' AND key = $1`, key).Scan(&end)
		return end, err
	}
	// renewed waits until a renewal of key's lease has committed (it runs
	// in the handler's goroutine, so it returns what went wrong).
	renewed := func(key string) error {
		claimed, err := leaseEnd(key)
		if err != nil {
			return err
		}
		if !oncetest.Poll(lease, func() bool {
			end, e := leaseEnd(key)
			err = e
			return err != nil || end.After(claimed)
		}) {
			return fmt.Errorf("%s: no renewal committed within a lease", key)
		}
		return err
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			key := fmt.Sprintf("rr-%d", i)
			out, err := e.Do(ctx, "tenant", key, []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				res, err := ledger(ctx, tx, "rr")
				if err != nil {
					return res, err
				}
				return res, renewed(key)
			})
			if err != nil || out.Status != http.StatusCreated {
				t.Errorf("execution %d: %v %v", i, out.Status, err)
			}
		})
	}
	wg.Wait()
	var completed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`).Scan(&completed))
	require.Equal(t, 4, completed)
}

// TestPostgresRestartCostsNoRequest: after Postgres restarts, every pooled
// connection is dead, and the engine finds out only when it uses one. The
// first requests after the restart still succeed — a claim, a step's
// record, a plain execution — instead of answering 503 once per dead
// connection.
func TestPostgresRestartCostsNoRequest(t *testing.T) {
	t.Parallel()
	srv, pool := privatePostgres(t)
	ctx := oncetest.Context(t)
	e, err := onceonly.New(onceonly.Config{Pool: pool, TwoPhase: true, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	require.NoError(t, e.Register("step", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		if _, err := onceonly.Step(ctx, "s", func(context.Context, string) (int, error) { return 1, nil }); err != nil {
			return onceonly.Result{}, err
		}
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		return ledger(ctx, tx, x.Key())
	}))
	warm := func() { // every connection of the pool opened and idle
		conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
		for i := range conns {
			conns[i], err = pool.Acquire(ctx)
			require.NoError(t, err)
		}
		for _, c := range conns {
			c.Release()
		}
	}
	for round := range 3 {
		warm()
		srv.Restart()
		for i := range 4 {
			key := fmt.Sprintf("restart-%d-%d", round, i)
			_, err := e.Run(ctx, "step", "tenant", key, []byte("p"))
			require.NoError(t, err, "%s: the first requests after a restart", key)
			_, err = e.Do(ctx, "tenant", key+"-do", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				return ledger(ctx, tx, key)
			})
			require.NoError(t, err, "%s-do", key)
		}
	}
}

// privatePostgres starts a Postgres of the test's own (to stop or restart)
// and returns it with a pool on its migrated database.
func privatePostgres(t *testing.T) (*oncetest.PostgresServer, *pgxpool.Pool) {
	t.Helper()
	srv := oncetest.NewPostgresServer(t)
	pool := oncetest.Pool(t, srv.URL())
	require.NoError(t, oncetest.MigrateUp(oncetest.Context(t), pool))
	return srv, pool
}
