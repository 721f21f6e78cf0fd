package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/demotest"
	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/demo/payments"
	"github.com/onceonly/onceonly/oncetest"
)

const apiKey = "sk_test_1"

type testBundle struct {
	ctx     context.Context
	dbURL   string
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	prefix  string
	servers []*httptest.Server
}

type setupOpts struct {
	instances int
	rdb       redis.UniversalClient // nil: shared test Redis with a prefix of the test's own
	latency   time.Duration
}

func setup(t testing.TB, opts setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), dbURL: oncetest.DatabaseURL(t)}
	b.pool = oncetest.Pool(t, b.dbURL)
	prefix := "idem:"
	if opts.rdb != nil {
		b.rdb = opts.rdb
	} else {
		b.rdb, prefix = oncetest.Redis(t)
	}
	b.prefix = prefix
	quiet := slog.New(slog.DiscardHandler)
	// tok_slow holds its charge SlowDelay at the gateway: the window in
	// which a test sees the key claimed and sends a copy that must be
	// answered 409. Seconds, for a loaded machine: a 1 s window closed
	// before the copy got in.
	gw := demotest.Gateway(t, b.pool, gateway.Config{Latency: opts.latency, SlowDelay: 5 * time.Second})
	for range max(opts.instances, 1) {
		// Each instance has a pool of its own, as separate processes would.
		pool := oncetest.Pool(t, b.dbURL)
		engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: b.rdb, RedisPrefix: prefix, LeaseTimeout: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(engine.Close)
		srv := httptest.NewServer(payments.NewHandler(payments.Config{
			Engine: engine, Pool: pool, APIKeys: map[string]string{apiKey: "acct_1", "sk_test_2": "acct_2"},
			Gateway: gw,
			Logger:  quiet,
		}))
		t.Cleanup(srv.Close)
		b.servers = append(b.servers, srv)
	}
	return b
}

type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request to the first instance.
func (b *testBundle) do(t *testing.T, method, path string, header map[string]string, body io.Reader) response {
	t.Helper()
	res, err := b.send(0, method, path, header, body)
	require.NoError(t, err)
	return res
}

// send is do without assertions, for goroutines other than the test's.
func (b *testBundle) send(i int, method, path string, header map[string]string, body io.Reader) (response, error) {
	req, err := http.NewRequestWithContext(b.ctx, method, b.servers[i%len(b.servers)].URL+path, body)
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{res.StatusCode, res.Header, string(raw)}, nil
}

func (b *testBundle) pay(t *testing.T, i int, key, body string) response {
	t.Helper()
	res, err := b.tryPay(i, key, body)
	require.NoError(t, err)
	return res
}

// tryPay is pay without assertions, for goroutines other than the test's.
func (b *testBundle) tryPay(i int, key, body string) (response, error) {
	return b.send(i, http.MethodPost, "/v1/payments", map[string]string{
		"Authorization": "Bearer " + apiKey, "Idempotency-Key": key, "Content-Type": "application/json",
	}, strings.NewReader(body))
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

const visa = `{"amount":1000,"currency":"usd","customer":"cus_1","source":"tok_visa"}`

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code  string `json:"code"`
			Param string `json:"param"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Error.Code
}

func TestCreateAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	first := b.pay(t, 0, "k1", visa)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Empty(t, first.header.Get(onceonly.HeaderReplayed))
	var p payments.Payment
	require.NoError(t, json.Unmarshal([]byte(first.body), &p))
	require.True(t, strings.HasPrefix(p.ID, "pay_"))
	require.Equal(t, "succeeded", p.Status)
	_, err := time.Parse(time.RFC3339, p.Created)
	require.NoError(t, err)
	require.Equal(t, "/v1/payments/"+p.ID, first.header.Get("Location"))
	var charge string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT charge_id FROM gateway.charges WHERE reference = 'acct_1/k1'`).Scan(&charge))
	require.Equal(t, charge, p.Charge, "the payment carries the gateway's charge id")

	// Whitespace and key order are the same payload.
	again := b.pay(t, 0, "k1", `{ "source":"tok_visa", "customer":"cus_1","currency":"usd","amount":1000 }`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(onceonly.HeaderReplayed))
	require.Equal(t, first.body, again.body)
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"), "the handler's headers are replayed (I2)")
	require.NoError(t, b.rdb.Del(b.ctx, b.prefix+"acct_1:k1").Err()) // and from Postgres as well as from Redis
	fromPG := b.pay(t, 0, "k1", visa)
	require.Equal(t, "true", fromPG.header.Get(onceonly.HeaderReplayed))
	require.Equal(t, first.header.Get("Location"), fromPG.header.Get("Location"))
	require.Equal(t, first.body, fromPG.body)

	reused := b.pay(t, 0, "k1", strings.Replace(visa, "1000", "1001", 1))
	require.Equal(t, http.StatusUnprocessableEntity, reused.status)
	require.Equal(t, "idempotency_key_reused", errorCode(t, reused.body))

	got := b.do(t, http.MethodGet, "/v1/payments/"+p.ID, map[string]string{"Authorization": "Bearer " + apiKey}, nil)
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, first.body, got.body)
	other := b.do(t, http.MethodGet, "/v1/payments/"+p.ID, map[string]string{"Authorization": "Bearer sk_test_2"}, nil)
	require.Equal(t, http.StatusNotFound, other.status, "another merchant's payment")
	require.Equal(t, 1, b.count(t, "payments"))
}

func TestGatewaySources(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	declined := strings.Replace(visa, "tok_visa", "tok_chargeDeclined", 1)
	d1 := b.pay(t, 0, "d", declined)
	require.Equal(t, http.StatusPaymentRequired, d1.status)
	require.Equal(t, "card_declined", errorCode(t, d1.body))
	d2 := b.pay(t, 0, "d", declined)
	require.Equal(t, d1.body, d2.body)
	require.Equal(t, "true", d2.header.Get(onceonly.HeaderReplayed))

	failing := strings.Replace(visa, "tok_visa", "tok_gatewayError", 1)
	for range 2 {
		g := b.pay(t, 0, "g", failing)
		require.Equal(t, http.StatusBadGateway, g.status)
		require.Equal(t, "gateway_error", errorCode(t, g.body))
		require.Empty(t, g.header.Get(onceonly.HeaderReplayed), "a gateway error is not stored: the retry runs again")
	}
	var status string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM idempotency_keys WHERE key = 'g'`).Scan(&status))
	require.Equal(t, "failed", status)

	slow := strings.Replace(visa, "tok_visa", "tok_slow", 1)
	type result struct {
		res response
		err error
	}
	done := make(chan result)
	go func() {
		res, err := b.tryPay(0, "s", slow)
		done <- result{res, err}
	}()
	oncetest.Eventually(t, 5*time.Second, "slow payment claimed", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 's'`).Scan(&n)
		return n == 1
	})
	conflict := b.pay(t, 0, "s", slow)
	require.Equal(t, http.StatusConflict, conflict.status)
	require.Equal(t, "idempotency_key_in_use", errorCode(t, conflict.body))
	require.NotEmpty(t, conflict.header.Get("Retry-After"))
	first := <-done
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.res.status)
	require.Equal(t, 2, b.count(t, "payments"), "one declined, one slow")
}

// TestBadInput: every malformed request gets its 4xx code, claims no key and
// writes no row (I10).
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	auth := "Bearer " + apiKey
	headers := func(kv ...string) map[string]string {
		h := map[string]string{"Authorization": auth, "Idempotency-Key": "key-1", "Content-Type": "application/json"}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(h, kv[i])
			} else {
				h[kv[i]] = kv[i+1]
			}
		}
		return h
	}
	field := func(name, value string) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(visa), &m))
		if value == "<unset>" {
			delete(m, name)
		} else {
			m[name] = json.RawMessage(value)
		}
		out, err := json.Marshal(m)
		require.NoError(t, err)
		return string(out)
	}
	big := `{"amount":1000,"currency":"usd","customer":"c","source":"tok_visa"}`
	big += strings.Repeat(" ", 64<<10-len(big))
	cases := []struct {
		name, method, path string
		header             map[string]string
		body               string
		status             int
		code, param        string
	}{
		{"NoAuth", "POST", "/v1/payments", headers("Authorization", "<unset>"), visa, 401, "unauthorized", ""},
		{"UnknownAPIKey", "POST", "/v1/payments", headers("Authorization", "Bearer sk_nope"), visa, 401, "unauthorized", ""},
		{"NotBearer", "POST", "/v1/payments", headers("Authorization", "Basic eDp5"), visa, 401, "unauthorized", ""},
		{"NoKey", "POST", "/v1/payments", headers("Idempotency-Key", "<unset>"), visa, 400, "idempotency_key_missing", "Idempotency-Key"},
		{"EmptyKey", "POST", "/v1/payments", headers("Idempotency-Key", ""), visa, 400, "idempotency_key_invalid", "Idempotency-Key"},
		{"KeyWithSpace", "POST", "/v1/payments", headers("Idempotency-Key", "a b"), visa, 400, "idempotency_key_invalid", "Idempotency-Key"},
		{"KeyTooLong", "POST", "/v1/payments", headers("Idempotency-Key", strings.Repeat("k", 256)), visa, 400, "idempotency_key_invalid", "Idempotency-Key"},
		{"KeyNonASCII", "POST", "/v1/payments", headers("Idempotency-Key", "ké"), visa, 400, "idempotency_key_invalid", "Idempotency-Key"},
		{"NoContentType", "POST", "/v1/payments", headers("Content-Type", "<unset>"), visa, 415, "unsupported_media_type", ""},
		{"TextPlain", "POST", "/v1/payments", headers("Content-Type", "text/plain"), visa, 415, "unsupported_media_type", ""},
		{"BrokenJSON", "POST", "/v1/payments", headers(), `{"amount":`, 400, "invalid_json", ""},
		{"TrailingData", "POST", "/v1/payments", headers(), visa + `{}`, 400, "invalid_json", ""},
		{"EmptyBody", "POST", "/v1/payments", headers(), ``, 400, "invalid_json", ""},
		{"Array", "POST", "/v1/payments", headers(), `[1]`, 400, "invalid_request", ""},
		{"Null", "POST", "/v1/payments", headers(), `null`, 400, "invalid_request", ""},
		{"UnknownField", "POST", "/v1/payments", headers(), field("tip", "1"), 400, "invalid_request", "tip"},
		{"NoAmount", "POST", "/v1/payments", headers(), field("amount", "<unset>"), 400, "invalid_request", "amount"},
		{"AmountZero", "POST", "/v1/payments", headers(), field("amount", "0"), 400, "invalid_request", "amount"},
		{"AmountTooBig", "POST", "/v1/payments", headers(), field("amount", "100000000"), 400, "invalid_request", "amount"},
		{"AmountFraction", "POST", "/v1/payments", headers(), field("amount", "10.5"), 400, "invalid_request", "amount"},
		{"AmountString", "POST", "/v1/payments", headers(), field("amount", `"100"`), 400, "invalid_request", "amount"},
		{"CurrencyUpper", "POST", "/v1/payments", headers(), field("currency", `"USD"`), 400, "invalid_request", "currency"},
		{"CurrencyUnknown", "POST", "/v1/payments", headers(), field("currency", `"xyz"`), 400, "invalid_request", "currency"},
		{"CurrencyNumber", "POST", "/v1/payments", headers(), field("currency", `1`), 400, "invalid_request", "currency"},
		{"NoCustomer", "POST", "/v1/payments", headers(), field("customer", "<unset>"), 400, "invalid_request", "customer"},
		{"EmptyCustomer", "POST", "/v1/payments", headers(), field("customer", `""`), 400, "invalid_request", "customer"},
		{"LongCustomer", "POST", "/v1/payments", headers(), field("customer", `"`+strings.Repeat("c", 256)+`"`), 400, "invalid_request", "customer"},
		{"UnknownSource", "POST", "/v1/payments", headers(), field("source", `"tok_amex"`), 400, "invalid_request", "source"},
		{"LongDescription", "POST", "/v1/payments", headers(), field("description", `"`+strings.Repeat("d", 1001)+`"`), 400, "invalid_request", "description"},
		{"DescriptionNumber", "POST", "/v1/payments", headers(), field("description", `5`), 400, "invalid_request", "description"},
		{"TooLarge", "POST", "/v1/payments", headers(), big + " ", 413, "request_too_large", ""},
		{"DuplicateName", "POST", "/v1/payments", headers(), `{"amount":1000,"amount":2000,"currency":"usd","customer":"c","source":"tok_visa"}`, 400, "invalid_json", ""},
		{"DuplicateNameEscaped", "POST", "/v1/payments", headers(), `{"amount":1000,"\u0061mount":2000,"currency":"usd","customer":"c","source":"tok_visa"}`, 400, "invalid_json", ""},
		{"DuplicateNested", "POST", "/v1/payments", headers(), `{"amount":1000,"currency":"usd","customer":"c","source":"tok_visa","description":null,"x":{"a":1,"a":2}}`, 400, "invalid_json", ""},
		{"NULInCustomer", "POST", "/v1/payments", headers(), field("customer", `"a\u0000b"`), 400, "invalid_request", "customer"},
		{"LoneHighSurrogate", "POST", "/v1/payments", headers(), field("customer", `"x\ud800y"`), 400, "invalid_request", "customer"},
		{"LoneLowSurrogate", "POST", "/v1/payments", headers(), field("description", `"\udc00"`), 400, "invalid_request", "description"},
		{"InvalidUTF8", "POST", "/v1/payments", headers(), `{"amount":1000,"currency":"usd","customer":"c` + "\xff" + `","source":"tok_visa"}`, 400, "invalid_request", "customer"},
		{"GetCollection", "GET", "/v1/payments", headers(), "", 405, "method_not_allowed", ""},
		{"DeletePayment", "DELETE", "/v1/payments/pay_x", headers(), "", 405, "method_not_allowed", ""},
		{"UnknownPayment", "GET", "/v1/payments/pay_nope", headers(), "", 404, "not_found", "id"},
		{"UnknownRoute", "POST", "/v2/refunds", headers(), visa, 404, "not_found", ""},
	}
	for _, tc := range cases {
		res := b.do(t, tc.method, tc.path, tc.header, strings.NewReader(tc.body))
		require.Equal(t, tc.status, res.status, "%s: %s", tc.name, res.body)
		require.Equal(t, "application/json", res.header.Get("Content-Type"), tc.name)
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Message string `json:"message"`
				Param   string `json:"param"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(res.body), &e), tc.name)
		require.Equal(t, tc.code, e.Error.Code, tc.name)
		require.Equal(t, tc.param, e.Error.Param, tc.name)
		require.NotEmpty(t, e.Error.Type, tc.name)
		require.NotEmpty(t, e.Error.Message, tc.name)
	}
	require.Zero(t, b.count(t, "idempotency_keys"), "bad input claims no key (I10)")

	// A chunked body over the limit is refused as well.
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.servers[0].URL+"/v1/payments", io.MultiReader(strings.NewReader(big), strings.NewReader("  ")))
	require.NoError(t, err)
	for k, v := range headers() {
		req.Header.Set(k, v)
	}
	req.ContentLength = -1
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode)

	require.Zero(t, b.count(t, "idempotency_keys"), "no key claimed")
	require.Zero(t, b.count(t, "payments"), "no row written")

	// The edges that are accepted: exactly 64 KiB, and a charset parameter.
	require.Len(t, big, 64<<10)
	ok := b.do(t, "POST", "/v1/payments", headers("Content-Type", "application/json; charset=utf-8"), strings.NewReader(big))
	require.Equal(t, http.StatusCreated, ok.status, ok.body)
}

type tally struct {
	sync.Mutex
	executed, replayed, conflicts int
	bodies                        map[string]int
	other                         []string
}

func (tl *tally) add(res response) {
	tl.Lock()
	defer tl.Unlock()
	switch {
	case res.status == http.StatusCreated && res.header.Get(onceonly.HeaderReplayed) == "":
		tl.executed++
		tl.bodies[res.body]++
	case res.status == http.StatusCreated:
		tl.replayed++
		tl.bodies[res.body]++
	case res.status == http.StatusConflict && res.header.Get("Retry-After") != "":
		tl.conflicts++
	default:
		tl.other = append(tl.other, fmt.Sprintf("%d %s", res.status, res.body))
	}
}

// burst sends n identical requests at once, spread over every instance.
func (b *testBundle) burst(t *testing.T, key string, n int, during func()) *tally {
	t.Helper()
	tl := &tally{bodies: map[string]int{}}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := b.tryPay(i, key, visa)
			if err != nil {
				errs[i] = err
				return
			}
			tl.add(res)
		})
	}
	close(start)
	if during != nil {
		during()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	return tl
}

// checkOnce asserts I1, I2 and I4 for one burst: one execution, every other
// answer a 409 or a byte-identical replay, one payments row.
func (b *testBundle) checkOnce(t *testing.T, key string, tl *tally) {
	t.Helper()
	require.Empty(t, tl.other)
	require.Equal(t, 1, tl.executed, "exactly one execution")
	require.Len(t, tl.bodies, 1, "every 201 is byte-identical")
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments WHERE idempotency_key = $1`, key).Scan(&n))
	require.Equal(t, 1, n)
	final := b.pay(t, 1, key, visa)
	require.Equal(t, http.StatusCreated, final.status)
	require.Equal(t, "true", final.header.Get(onceonly.HeaderReplayed))
	_, same := tl.bodies[final.body]
	require.True(t, same)
}

func TestConcurrentDuplicatesOverTwoInstances(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{instances: 2, latency: 50 * time.Millisecond})
	for round := range 3 {
		key := fmt.Sprintf("burst-%d", round)
		tl := b.burst(t, key, 100, nil)
		b.checkOnce(t, key, tl)
		require.Equal(t, 99, tl.conflicts+tl.replayed)
	}
}

// TestConcurrentDuplicatesWithFlushAll: the cache is wiped before the burst
// and again while it runs; Postgres keeps it to one execution (I6).
func TestConcurrentDuplicatesWithFlushAll(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	rdb := oncetest.RedisClient(t, srv.URL())
	b := setup(t, setupOpts{instances: 2, rdb: rdb, latency: 50 * time.Millisecond})
	for round := range 3 {
		key := fmt.Sprintf("flush-%d", round)
		require.NoError(t, rdb.FlushAll(b.ctx).Err())
		tl := b.burst(t, key, 100, func() {
			for range 5 {
				time.Sleep(15 * time.Millisecond) // the pace of the flushes during the burst, not a wait for an event
				require.NoError(t, rdb.FlushAll(b.ctx).Err())
			}
		})
		b.checkOnce(t, key, tl)
	}
}

// TestRedisDownServesFromPostgres: with the Redis server stopped the API
// stays correct, and recovers when it comes back.
func TestRedisDownServesFromPostgres(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	b := setup(t, setupOpts{instances: 2, rdb: rdb, latency: 20 * time.Millisecond})
	srv.Stop()
	tl := b.burst(t, "down", 30, nil)
	b.checkOnce(t, "down", tl)
	srv.Start()
	again := b.pay(t, 0, "down", visa)
	require.Equal(t, "true", again.header.Get(onceonly.HeaderReplayed))
	require.Equal(t, 1, b.count(t, "payments"))
}

func TestPostgresDownIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	admin := oncetest.Pool(t, oncetest.AdminDatabaseURL(t))
	// Cut the api off Postgres: terminate its connections and forbid new ones.
	_, err := admin.Exec(b.ctx, `ALTER DATABASE `+dbName(b.dbURL)+` ALLOW_CONNECTIONS false`)
	require.NoError(t, err)
	_, err = admin.Exec(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName(b.dbURL))
	require.NoError(t, err)
	res := b.pay(t, 0, "pg-down", visa)
	require.Equal(t, http.StatusServiceUnavailable, res.status, res.body)
	require.Equal(t, "service_unavailable", errorCode(t, res.body))
	require.NotEmpty(t, res.header.Get("Retry-After"))
	_, err = admin.Exec(b.ctx, `ALTER DATABASE `+dbName(b.dbURL)+` ALLOW_CONNECTIONS true`)
	require.NoError(t, err)
	res = b.pay(t, 0, "pg-down", visa)
	require.Equal(t, http.StatusCreated, res.status, "the provisional claim was released: "+res.body)
}

func dbName(raw string) string {
	u, _ := url.Parse(raw)
	return strings.TrimPrefix(u.Path, "/")
}
