// Command harness serves the variants the side-by-side benchmark compares,
// all doing the same business write, on consecutive ports:
//
//	base+0  (a) a bare handler doing one Redis GET
//	base+1  (b) a bare handler doing one INSERT transaction
//	base+2  (c) Redis-only idempotency: a check-and-lock Lua script, the
//	            response kept in Redis, no Postgres record of the key
//	base+3  (d) Postgres-only idempotency: onceonly with no Redis
//	base+4  (e) onceonly, as configured by default (one commit, NOTIFY deferred)
//	base+5  (e) onceonly with NotifyInTransaction (DEFER_NOTIFY=false)
//	base+6  (f) onceonly with TwoPhase (the claim commits on its own first)
//	base+7  (g) onceonly with RedisNoAutoPipeline (a round trip per command)
//	base+8  (h) onceonly with NoClaimBatching (a statement per claim)
//	base+9  net/http/pprof
//
//	harness serve   [-base 29001]   serve until SIGTERM
//	harness dupes   [-n 300]        duplicate effects under retries and a FLUSHALL, JSON
//	harness memory                  Redis MEMORY USAGE of onceonly's values, JSON
//
// DATABASE_URL and REDIS_URL name the servers; bench/compare.sh runs it all.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: harness serve|dupes|memory [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	base := fs.Int("base", 29001, "first port (serve)")
	n := fs.Int("n", 300, "logical requests per variant (dupes)")
	_ = fs.Parse(os.Args[2:])
	if err := run(os.Args[1], *base, *n); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		os.Exit(1)
	}
}

// run runs command cmd until it is done or SIGINT/SIGTERM arrives.
func run(cmd string, base, n int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, rdb, err := connect(ctx)
	if err != nil {
		return err
	}
	h, err := newHarness(pool, rdb)
	if err != nil {
		return err
	}
	switch cmd {
	case "serve":
		return h.serve(ctx, base)
	case "dupes":
		result, err := h.dupes(ctx, n)
		if err != nil {
			return err
		}
		return writeJSON(result)
	case "memory":
		usage, err := h.memory(ctx)
		if err != nil {
			return err
		}
		return writeJSON(usage)
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
}

// writeJSON writes v to stdout as one line of JSON.
func writeJSON(v any) error {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return fmt.Errorf("write the result: %w", err)
	}
	return nil
}

type harness struct {
	pool      *pgxpool.Pool
	rdb       *redis.Client
	pgOnly    *onceonly.Engine
	full      *onceonly.Engine
	inTx      *onceonly.Engine
	twoPhase  *onceonly.Engine
	unpiped   *onceonly.Engine
	unbatched *onceonly.Engine
	lockCheck *redis.Script
}

// connect opens the servers DATABASE_URL and REDIS_URL name, with pools
// large enough for the benchmark's connections.
func connect(ctx context.Context) (*pgxpool.Pool, *redis.Client, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 64
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	opts.PoolSize = 64
	return pool, redis.NewClient(opts), nil
}

func newHarness(pool *pgxpool.Pool, rdb *redis.Client) (*harness, error) {
	quiet := slog.New(slog.DiscardHandler)
	pgOnly, err := onceonly.New(onceonly.Config{Pool: pool, Logger: quiet})
	if err != nil {
		return nil, err
	}
	full, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: quiet})
	if err != nil {
		return nil, err
	}
	inTx, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: quiet, Tuning: onceonly.Tuning{NotifyInTransaction: true}})
	if err != nil {
		return nil, err
	}
	twoPhase, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: quiet, TwoPhase: true})
	if err != nil {
		return nil, err
	}
	unpiped, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: quiet, Tuning: onceonly.Tuning{RedisNoAutoPipeline: true}})
	if err != nil {
		return nil, err
	}
	unbatched, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, Logger: quiet, Tuning: onceonly.Tuning{NoClaimBatching: true}})
	if err != nil {
		return nil, err
	}
	return &harness{pool: pool, rdb: rdb, pgOnly: pgOnly, full: full, inTx: inTx, twoPhase: twoPhase, unpiped: unpiped,
		unbatched: unbatched, lockCheck: redis.NewScript(lockCheckLua)}, nil
}

// handlers returns the variants in port order.
func (h *harness) handlers() []http.Handler {
	mw := func(e *onceonly.Engine, scope string) http.Handler {
		return e.Middleware(onceonly.MiddlewareOptions{
			Scope: func(*http.Request) (string, error) { return scope, nil },
		})(http.HandlerFunc(h.charge))
	}
	return []http.Handler{
		http.HandlerFunc(h.redisGet),
		http.HandlerFunc(h.charge),
		h.redisOnly(http.HandlerFunc(h.charge)),
		mw(h.pgOnly, "pgonly"),
		mw(h.full, "full"),
		mw(h.inTx, "notify-in-tx"),
		mw(h.twoPhase, "two-phase"),
		mw(h.unpiped, "unpiped"),
		mw(h.unbatched, "unbatched"),
	}
}

// seed stores the value variant (a) reads.
func (h *harness) seed(ctx context.Context) error {
	if err := h.rdb.Set(ctx, "bench:get", fmt.Sprintf(`{"id":"pay_%0182d"}`, 0), 0).Err(); err != nil {
		return fmt.Errorf("seed variant (a): %w", err)
	}
	return nil
}

func (h *harness) serve(ctx context.Context, base int) error {
	if err := h.seed(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	handlers := h.handlers()
	errc := make(chan error, len(handlers)+1)
	var servers []*http.Server
	profiles := http.NewServeMux()
	profiles.HandleFunc("/debug/pprof/", pprof.Index)
	profiles.HandleFunc("/debug/pprof/profile", pprof.Profile)
	ports := map[int]http.Handler{base + 9: profiles}
	for i, handler := range handlers {
		ports[base+i] = handler
	}
	for port, handler := range ports {
		srv := &http.Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", srv.Addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", srv.Addr, err)
		}
		wg.Go(func() {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	fmt.Fprintf(os.Stderr, "harness: serving the variants on ports %d..%d, pprof on %d\n", base, base+len(handlers)-1, base+9)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	for _, srv := range servers {
		_ = srv.Shutdown(context.WithoutCancel(ctx)) // ctx has ended
	}
	wg.Wait()
	return nil
}

// redisGet is variant (a).
func (h *harness) redisGet(w http.ResponseWriter, r *http.Request) {
	v, err := h.rdb.Get(r.Context(), "bench:get").Bytes()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(v)
}

// charge is the business write every other variant does: one payments row.
// Under onceonly it runs in the engine's transaction.
func (h *harness) charge(w http.ResponseWriter, r *http.Request) {
	var id [12]byte
	_, _ = rand.Read(id[:])
	payID := "pay_" + hex.EncodeToString(id[:])
	key := r.Header.Get("Idempotency-Key")
	const sql = `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
		VALUES ($1, 'acct_bench', $2, 1000, 'usd', 'cus_bench', 'succeeded')`
	var err error
	if _, inside := onceonly.ExecutionOf(r.Context()); inside {
		var tx pgx.Tx
		if tx, err = onceonly.Tx(r.Context()); err == nil {
			_, err = tx.Exec(r.Context(), sql, payID, key)
		}
	} else {
		_, err = h.pool.Exec(r.Context(), sql, payID, key)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"object":"payment","amount":1000,"currency":"usd","customer":"cus_bench","status":"succeeded","padding":"%0100d"}`, payID, 0)
}

// lockCheckLua is the seeds' Redis-only pattern: a stored response is
// replayed, a held lock is a conflict, otherwise the lock is taken.
const lockCheckLua = `
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], 'lock', 'PX', ARGV[1])
  return {0}
end
if v == 'lock' then return {2} end
return {1, v}`

// redisOnly is variant (c): idempotency kept in Redis alone.
func (h *harness) redisOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := "ronly:" + r.Header.Get("Idempotency-Key")
		reply, err := h.lockCheck.Run(r.Context(), h.rdb, []string{key}, 30000).Slice()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		code, ok := reply[0].(int64)
		if !ok {
			http.Error(w, fmt.Sprintf("lock check: unexpected reply %v", reply), http.StatusServiceUnavailable)
			return
		}
		switch code {
		case 1:
			stored, ok := reply[1].(string)
			if !ok {
				http.Error(w, fmt.Sprintf("lock check: unexpected reply %v", reply), http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, stored) //nolint:gosec // G705: replays the JSON this handler stored, served as application/json
			return
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"in progress"}`, http.StatusConflict)
			return
		}
		rec := &recorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status/100 == 2 {
			_ = h.rdb.Set(r.Context(), key, rec.body, 24*time.Hour).Err()
		} else {
			_ = h.rdb.Del(r.Context(), key).Err()
		}
	})
}

type recorder struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body = append(r.body, b...)
	return r.ResponseWriter.Write(b)
}

// dupeResult is what dupes saw for one variant.
type dupeResult struct {
	LogicalRequests int `json:"logical_requests"`
	Sent            int `json:"sent"`
	KeysCharged     int `json:"keys_charged"`
	// KeysChargedTwice counts the keys with more than one payments row.
	KeysChargedTwice int `json:"keys_charged_twice_or_more"`
}

// dupes sends n logical requests to each of (c), (d) and (e), each four
// times — two at once, two later — with a FLUSHALL halfway, and counts the
// keys that got more than one payments row.
func (h *harness) dupes(ctx context.Context, n int) (map[string]dupeResult, error) {
	variants := map[string]http.Handler{}
	hs := h.handlers()
	variants["c_redis_only"], variants["d_postgres_only"], variants["e_onceonly"], variants["e_onceonly_notify_in_tx"] = hs[2], hs[3], hs[4], hs[5]
	variants["f_onceonly_two_phase"] = hs[6]
	run := fmt.Sprintf("dup-%d", time.Now().UnixNano())
	result := map[string]dupeResult{}
	for name, handler := range variants {
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
		go func() { _ = srv.Serve(l) }()
		url := "http://" + l.Addr().String()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		send := func(key string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			for range 20 {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
				req.Header.Set("Idempotency-Key", key)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				res.Body.Close()
				if res.StatusCode != http.StatusConflict && res.StatusCode < 500 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		for i := range n {
			key := fmt.Sprintf("%s-%s-%d", run, name, i)
			for copyN := range 4 {
				wg.Add(1)
				go func() {
					time.Sleep(time.Duration(i)*2*time.Millisecond + time.Duration(copyN/2)*time.Duration(n)*time.Millisecond)
					send(key)
				}()
			}
		}
		time.Sleep(time.Duration(n) * time.Millisecond)
		_ = h.rdb.FlushAll(ctx).Err() // halfway: the cache is lost
		wg.Wait()
		_ = srv.Shutdown(ctx)
		var keys, dup int
		err = h.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c > 1) FROM (
			SELECT idempotency_key, count(*) AS c FROM payments WHERE idempotency_key LIKE $1 GROUP BY 1) s`,
			run+"-"+name+"-%").Scan(&keys, &dup)
		if err != nil {
			return nil, fmt.Errorf("count the charged keys of %s: %w", name, err)
		}
		result[name] = dupeResult{LogicalRequests: n, Sent: 4 * n, KeysCharged: keys, KeysChargedTwice: dup}
	}
	return result, nil
}

// memoryScope is the scope of the keys memory measures.
const memoryScope = "acct_1234"

// memory reports Redis MEMORY USAGE of a completed key with a 200-byte body
// and of an in-progress key, as onceonly writes them.
func (h *harness) memory(ctx context.Context) (map[string]int64, error) {
	c := cache.New(h.rdb, cache.Options{Prefix: "mem:"})
	body := []byte(fmt.Sprintf(`{"id":"pay_%0187d"}`, 0)) // 200 bytes
	updates := []keystate.Key{
		{Ref: keystate.Ref{Scope: memoryScope, Key: "order-000000000001"}, Version: 2, Status: keystate.Completed, Fingerprint: "v1:" + hex.EncodeToString(make([]byte, 32)),
			ExpiresIn: 24 * time.Hour, Response: keystate.Response{Status: 201, ContentType: "application/json", Body: body}},
		{Ref: keystate.Ref{Scope: memoryScope, Key: "order-000000000002"}, Version: 1, Status: keystate.InProgress, Fingerprint: "v1:" + hex.EncodeToString(make([]byte, 32)),
			ExpiresIn: 24 * time.Hour, Owner: keystate.Owner{1}, LeaseRemaining: 30 * time.Second},
		{Ref: keystate.Ref{Scope: memoryScope, Key: "order-000000000004"}, Version: 2, Status: keystate.Completed, Fingerprint: "v1:" + hex.EncodeToString(make([]byte, 32)),
			ExpiresIn: 24 * time.Hour, Response: keystate.Response{Status: 201, ContentType: "application/json", Body: body,
				Header: http.Header{"Location": {"/v1/payments/pay_" + strings.Repeat("x", 24)}}}},
	}
	out := map[string]int64{"body_bytes": int64(len(body))}
	for i, u := range updates {
		if _, err := c.Apply(ctx, u); err != nil {
			return nil, err
		}
		n, err := h.rdb.MemoryUsage(ctx, c.Key(u.Ref)).Result()
		if err != nil {
			return nil, fmt.Errorf("memory usage of %s: %w", u.Key, err)
		}
		out[[]string{"completed_key_bytes", "in_progress_key_bytes", "completed_key_with_location_bytes"}[i]] = n
	}
	bare := c.Key(keystate.Ref{Scope: memoryScope, Key: "order-000000000003"}) // a key name of the same length
	if err := h.rdb.Set(ctx, bare, body, 24*time.Hour).Err(); err != nil {
		return nil, fmt.Errorf("set the bare key: %w", err)
	}
	n, err := h.rdb.MemoryUsage(ctx, bare).Result()
	if err != nil {
		return nil, fmt.Errorf("memory usage of the bare key: %w", err)
	}
	out["bare_set_of_the_body_bytes"] = n
	return out, nil
}
