package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/console"
	"github.com/onceonly/onceonly/oncetest"
)

const (
	user     = "ops"
	password = "s3cret-pass"
	// scope is the scope of the keys the tests make.
	scope = "acct_a"
)

type testBundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	rdb     *redis.Client
	prefix  string
	engine  *onceonly.Engine
	console *console.Console
	server  *httptest.Server
}

type setupOpts struct {
	readOnly, redact bool
	thresholds       console.Thresholds
}

func setup(t *testing.T, opts setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t)}
	b.rdb, b.prefix = oncetest.Redis(t)
	// The application's table the handlers write (the engine's migrations
	// create none since the demo's schema moved to the demo).
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE payments (id text PRIMARY KEY, merchant_id text NOT NULL,
		idempotency_key text NOT NULL, amount bigint NOT NULL, currency text NOT NULL, customer text NOT NULL, status text NOT NULL)`)
	require.NoError(t, err)
	b.engine, err = onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, Logger: oncetest.QuietLogger(), LeaseTimeout: 10 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)
	b.console, err = console.New(console.Config{
		Engine: b.engine, Pool: b.pool, Auth: user + ":" + password,
		ReadOnly: opts.readOnly, Redact: opts.redact, Thresholds: opts.thresholds, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", b.console)
	mux.Handle("/console", b.console)
	b.server = httptest.NewServer(mux)
	t.Cleanup(b.server.Close)
	return b
}

// response is an answer of the console.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request with the console's credentials (unless auth is
// false) and does not follow redirects.
func (b *testBundle) do(t *testing.T, method, path string, form url.Values, auth bool) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.ctx, method, b.server.URL+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth {
		req.SetBasicAuth(user, password)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: string(raw)}
}

func (b *testBundle) get(t *testing.T, path string) response {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil, true)
}

func (b *testBundle) post(t *testing.T, path string, form url.Values) response {
	t.Helper()
	return b.do(t, http.MethodPost, path, form, true)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token returns the CSRF token of the form on the page at path.
func (b *testBundle) token(t *testing.T, path string) string {
	t.Helper()
	page := b.get(t, path)
	require.Equal(t, http.StatusOK, page.status, page.body)
	m := csrfField.FindStringSubmatch(page.body)
	require.NotNil(t, m, "a form with a token on %s", path)
	return m[1]
}

// keyPath is the path of a key's page.
func keyPath(scope, key string) string {
	return "/console/keys/" + url.PathEscape(scope) + "/" + url.PathEscape(key)
}

// complete runs key to completion with body as its stored response, writing
// a payment row.
func (b *testBundle) complete(t *testing.T, key, body string) {
	t.Helper()
	_, err := b.engine.Do(b.ctx, scope, key, []byte("payload"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		_, err := tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status)
			VALUES (gen_random_uuid()::text, $1, $2, 100, 'usd', 'c', 'succeeded')`, scope, key)
		return onceonly.Result{Status: 201, ContentType: "text/html", Body: []byte(body)}, err
	})
	require.NoError(t, err)
}

// fail leaves key failed.
func (b *testBundle) fail(t *testing.T, key string) {
	t.Helper()
	_, err := b.engine.Do(b.ctx, scope, key, []byte("payload"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{}, errors.New("declined by the test")
	})
	require.Error(t, err)
}

// holdInStep leaves key in progress, its step "charge" settled with
// outcome and its request kept: the handler blocks until the test ends.
func (b *testBundle) holdInStep(t *testing.T, key, request, outcome string) {
	t.Helper()
	release := make(chan struct{})
	name := "hold-" + key
	require.NoError(t, b.engine.Register(name, func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		if _, err := onceonly.Step(ctx, "charge", func(context.Context, string) (string, error) { return outcome, nil }); err != nil {
			return onceonly.Result{}, err
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return onceonly.Result{Status: 200}, nil
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.engine.Run(b.ctx, name, scope, key, []byte(request))
	}()
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		<-done
	})
	oncetest.Eventually(t, 10*time.Second, "the step's outcome recorded", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND steps->'charge' ? 'outcome'`, key).Scan(&n)
		return n == 1
	})
}

func (b *testBundle) redisKey(key string) string { return b.prefix + scope + ":" + key }

func (b *testBundle) rows(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND key = $2`, scope, key).Scan(&n))
	return n
}

func TestEveryPathNeedsTheCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "k1", "{}")
	paths := []string{"/console/", "/console", "/console/keys", keyPath("acct_a", "k1"), keyPath("acct_a", "k1") + "/purge",
		"/console/events", "/console/static/console.css", "/console/no/such/page"}
	wrong := []func(*http.Request){
		func(*http.Request) {},
		func(r *http.Request) { r.SetBasicAuth(user, "wrong") },
		func(r *http.Request) { r.SetBasicAuth("wrong", password) },
		func(r *http.Request) { r.SetBasicAuth(user, password+"x") },
		func(r *http.Request) { r.SetBasicAuth("", "") },
		func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+password) },
	}
	for _, path := range paths {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for i, set := range wrong {
				req, err := http.NewRequestWithContext(b.ctx, method, b.server.URL+path, nil)
				require.NoError(t, err)
				set(req)
				res, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				_ = res.Body.Close()
				require.Equal(t, http.StatusUnauthorized, res.StatusCode, "%s %s, credentials %d", method, path, i)
				require.Contains(t, res.Header.Get("WWW-Authenticate"), "Basic", path)
			}
		}
	}
	require.Equal(t, http.StatusOK, b.get(t, "/console/").status)
	require.Equal(t, http.StatusMovedPermanently, b.get(t, "/console").status)
	require.Equal(t, http.StatusNotFound, b.get(t, "/console/no/such/page").status)
}

func TestKeyPageShowsBothSides(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "pay/1?x#y", `{"id":"pay_1"}`)
	path := keyPath("acct_a", "pay/1?x#y")
	require.Contains(t, path, "pay%2F1%3Fx%23y", "the key is one percent-encoded segment")

	page := b.get(t, path)
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Contains(t, page.body, `data-sync="in_sync"`)
	require.Regexp(t, `data-field="state"><th>state</th><td class="pg">completed</td><td class="redis">completed</td>`, page.body)
	require.Regexp(t, `data-field="version"><th>version</th><td class="pg">(\d+)</td><td class="redis">(\d+)</td>`, page.body)
	require.Contains(t, page.body, `data-field="response-status">201<`)
	require.Contains(t, page.body, "pay_1", "the body, behind its toggle")
	require.Regexp(t, `<details class="blob"><summary>[^<]*show</summary>\s*<pre>\{`, page.body, "the body behind a toggle")
	require.NotContains(t, page.body, "<script", "no script on any page")
	require.Equal(t, "no-store", page.header.Get("Cache-Control"))
	require.Contains(t, page.header.Get("Content-Security-Policy"), "default-src 'none'")

	// No Redis value: missing.
	require.NoError(t, b.rdb.Del(b.ctx, b.redisKey("pay/1?x#y")).Err())
	require.Contains(t, b.get(t, path).body, `data-sync="missing"`)

	// A value that does not decode: differs, and repairable.
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("pay/1?x#y"), "garbage", time.Minute).Err())
	page = b.get(t, path)
	require.Contains(t, page.body, `data-sync="differs" data-drift="corrupt">Differs (corrupt)`)
	require.Contains(t, page.body, "Repair Redis from Postgres")

	// Another version: stale; another state at the same version: wrong state.
	version, err := strconv.Atoi(regexp.MustCompile(`data-field="version"><th>version</th><td class="pg">(\d+)<`).FindStringSubmatch(page.body)[1])
	require.NoError(t, err)
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("pay/1?x#y"), fmt.Sprintf("failed:%d:c12345678", version-1), time.Minute).Err())
	require.Contains(t, b.get(t, path).body, fmt.Sprintf(`data-sync="differs" data-drift="stale">Differs (stale): Redis holds version %d, Postgres version %d.`, version-1, version))
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("pay/1?x#y"), fmt.Sprintf("failed:%d:c12345678", version), time.Minute).Err())
	require.Contains(t, b.get(t, path).body, `data-sync="differs" data-drift="wrong_state">Differs (wrong state): Redis holds failed, Postgres completed, at the same version.`)

	// A Redis value for a key Postgres does not have: differs (orphaned).
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("ghost"), "failed:3:", time.Minute).Err())
	page = b.get(t, keyPath("acct_a", "ghost"))
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, page.body, `data-sync="differs" data-drift="orphaned"`)

	// Neither side: 404.
	require.Equal(t, http.StatusNotFound, b.get(t, keyPath("acct_a", "never")).status)
}

func TestKeyPageShowsStepsAndTheRequestKept(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.holdInStep(t, "k-step", `{"amount":100}`, "ch_123")
	page := b.get(t, keyPath("acct_a", "k-step"))
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Regexp(t, `data-field="state"><th>state</th><td class="pg">in_progress</td>`, page.body)
	require.Contains(t, page.body, `data-step="charge"`)
	require.Contains(t, page.body, onceonly.DownstreamKey("acct_a", "k-step", "charge"))
	require.Contains(t, page.body, "ch_123")
	require.Contains(t, page.body, "hold-k-step", "the handler a resumption runs")
	require.Contains(t, page.body, "&#34;amount&#34;: 100", "the request kept, escaped")

	overview := b.get(t, "/console/")
	require.Regexp(t, `data-figure="in-progress">1<`, overview.body)
	require.Contains(t, overview.body, "k-step")
}

func TestStoredMarkupShowsAsText(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const body = `<script>document.title="pwned"</script><img src=x onerror=alert(1)>`
	const key = `<b>k</b>"'&`
	b.complete(t, key, body)
	for _, path := range []string{keyPath("acct_a", key), "/console/keys?scope=acct_a", "/console/keys?prefix=%3Cb", "/console/"} {
		page := b.get(t, path)
		require.Equal(t, http.StatusOK, page.status, path)
		require.NotContains(t, page.body, "<script", path)
		require.NotContains(t, page.body, "<img", path)
		require.NotContains(t, page.body, "<b>k</b>", path)
	}
	page := b.get(t, keyPath("acct_a", key))
	require.Contains(t, page.body, "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;")
	require.Contains(t, page.body, "&lt;b&gt;k&lt;/b&gt;&#34;&#39;&amp;")
}

func TestRedactHidesBodiesAndRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{redact: true})
	b.complete(t, "k-body", "card 4242 4242 4242 4242")
	b.holdInStep(t, "k-req", `{"customer":"Jane Roe"}`, "ch_secret")
	body := b.get(t, keyPath("acct_a", "k-body")).body
	require.NotContains(t, body, "4242")
	require.Contains(t, body, "redacted")
	body = b.get(t, keyPath("acct_a", "k-req")).body
	require.NotContains(t, body, "Jane Roe")
	require.NotContains(t, body, "ch_secret")
	require.Contains(t, body, onceonly.DownstreamKey("acct_a", "k-req", "charge"), "the step and its key still show")
}

func TestPurgeDeletesTheRowAndTheRedisValue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "k1", "{}")
	path := keyPath("acct_a", "k1")
	require.Equal(t, int64(1), b.rdb.Exists(b.ctx, b.redisKey("k1")).Val())

	confirm := b.get(t, path+"/purge")
	require.Equal(t, http.StatusOK, confirm.status)
	require.Contains(t, confirm.body, "Yes, purge this key")
	token := b.token(t, path+"/purge")

	// The confirmation is part of the form.
	res := b.post(t, path+"/purge", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusBadRequest, res.status)
	require.Equal(t, 1, b.rows(t, "k1"))

	res = b.post(t, path+"/purge", url.Values{"csrf": {token}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, 0, b.rows(t, "k1"), "the row is deleted")
	require.Equal(t, int64(0), b.rdb.Exists(b.ctx, b.redisKey("k1")).Val(), "the Redis value is deleted")
	var payments int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payments WHERE idempotency_key = 'k1'`).Scan(&payments))
	require.Equal(t, 1, payments, "the payment rows stay")
	list := b.get(t, res.header.Get("Location"))
	require.Contains(t, list.body, `data-notice="purged"`)
	require.Equal(t, http.StatusNotFound, b.get(t, path).status)

	// The next request with the key runs again.
	out, err := b.engine.Do(b.ctx, "acct_a", "k1", []byte("payload"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{Status: 200}, nil
	})
	require.NoError(t, err)
	require.False(t, out.Replayed)
}

func TestPurgeOfAKeyInProgressNeedsForce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.holdInStep(t, "k-held", "req", "ch_1")
	path := keyPath("acct_a", "k-held")
	confirm := b.get(t, path+"/purge")
	require.Contains(t, confirm.body, `name="force"`)
	token := b.token(t, path+"/purge")
	res := b.post(t, path+"/purge", url.Values{"csrf": {token}, "confirm": {"yes"}})
	require.Equal(t, http.StatusConflict, res.status)
	require.Equal(t, 1, b.rows(t, "k-held"))
	res = b.post(t, path+"/purge", url.Values{"csrf": {token}, "confirm": {"yes"}, "force": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Equal(t, 0, b.rows(t, "k-held"))
}

func TestActionsNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "k1", "{}")
	path := keyPath("acct_a", "k1")
	token := b.token(t, path+"/purge")
	for _, bad := range []url.Values{
		{"confirm": {"yes"}},
		{"confirm": {"yes"}, "csrf": {""}},
		{"confirm": {"yes"}, "csrf": {"x"}},
		{"confirm": {"yes"}, "csrf": {token + "x"}},
		{"confirm": {"yes"}, "csrf": {"9999999999." + strings.SplitN(token, ".", 2)[1]}}, // another expiry
		{"confirm": {"yes"}, "csrf": {"1." + strings.SplitN(token, ".", 2)[1]}},          // expired
	} {
		for _, action := range []string{path + "/purge", path + "/repair", "/console/events/unpark"} {
			res := b.post(t, action, bad)
			require.Equal(t, http.StatusForbidden, res.status, "%s %v", action, bad)
		}
	}
	require.Equal(t, 1, b.rows(t, "k1"))
	res := b.post(t, path+"/purge", url.Values{"confirm": {"yes"}, "csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.status, "the page's own token works")
}

func TestATokenIsBoundToItsUser(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// The host authenticates: the user is a header it trusts.
	c, err := console.New(console.Config{Engine: b.engine, Pool: b.pool, CSRFKey: []byte("shared key"),
		Authorize: func(r *http.Request) (string, bool) { u := r.Header.Get("X-User"); return u, u != "" }})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	send := func(method, path, who string, form url.Values) (int, string) {
		req, err := http.NewRequestWithContext(b.ctx, method, srv.URL+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if who != "" {
			req.Header.Set("X-User", who)
		}
		res, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		return res.StatusCode, string(raw)
	}
	code, _ := send(http.MethodGet, "/console/events", "", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	code, page := send(http.MethodGet, "/console/events", "alice", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "alice")
	id := insertParked(t, b, "k1")
	code, page = send(http.MethodGet, "/console/events", "alice", nil)
	require.Equal(t, http.StatusOK, code)
	token := csrfField.FindStringSubmatch(page)[1]
	form := url.Values{"csrf": {token}, "ids": {strconv.FormatInt(id, 10)}}
	code, _ = send(http.MethodPost, "/console/events/unpark", "mallory", form)
	require.Equal(t, http.StatusForbidden, code, "alice's token is not mallory's")
	code, _ = send(http.MethodPost, "/console/events/unpark", "alice", form)
	require.Equal(t, http.StatusSeeOther, code)
}

func TestReadOnlyShowsNoFormsAndRefusesPosts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	b.complete(t, "k1", "{}")
	insertParked(t, b, "k1")
	require.NoError(t, b.rdb.Del(b.ctx, b.redisKey("k1")).Err()) // a repair would apply
	for _, path := range []string{"/console/", "/console/keys", keyPath("acct_a", "k1"), "/console/events"} {
		page := b.get(t, path)
		require.Equal(t, http.StatusOK, page.status, path)
		require.NotContains(t, page.body, `method="post"`, path)
		require.NotContains(t, page.body, "/purge", path)
		require.Contains(t, page.body, "read-only", path)
	}
	require.Equal(t, http.StatusForbidden, b.get(t, keyPath("acct_a", "k1")+"/purge").status)
	// A token a read-write console made for the same credentials still
	// gets 403: no POST is taken.
	rw, err := console.New(console.Config{Engine: b.engine, Pool: b.pool, Auth: user + ":" + password})
	require.NoError(t, err)
	srv := httptest.NewServer(rw)
	defer srv.Close()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, srv.URL+"/console/keys/acct_a/k1/purge", nil)
	require.NoError(t, err)
	req.SetBasicAuth(user, password)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	token := csrfField.FindStringSubmatch(string(raw))[1]
	for _, action := range []string{keyPath("acct_a", "k1") + "/purge", keyPath("acct_a", "k1") + "/repair", "/console/events/unpark"} {
		res := b.post(t, action, url.Values{"csrf": {token}, "confirm": {"yes"}, "ids": {"1"}})
		require.Equal(t, http.StatusForbidden, res.status, action)
	}
	require.Equal(t, 1, b.rows(t, "k1"))
}

func TestRepairWritesRedisFromPostgres(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "k1", "{}")
	path := keyPath("acct_a", "k1")
	require.NoError(t, b.rdb.Del(b.ctx, b.redisKey("k1")).Err())
	token := b.token(t, path)
	res := b.post(t, path+"/repair", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	page := b.get(t, res.header.Get("Location"))
	require.Contains(t, page.body, `data-sync="in_sync"`)
	require.Contains(t, page.body, "Redis now holds the Postgres state")
}

// insertParked writes a parked outbox event for key and returns
// its id.
func insertParked(t *testing.T, b *testBundle, key string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO outbox (scope, key, version, attempts, parked_at, last_error)
		VALUES ($1, $2, 1, 10, now(), 'ERR the test refused <this>') RETURNING id`, scope, key).Scan(&id))
	return id
}

func TestUnparkPutsEventsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	first, second := insertParked(t, b, "k1"), insertParked(t, b, "k2")
	overview := b.get(t, "/console/")
	require.Regexp(t, `data-figure="parked"><a [^>]*>2<`, overview.body)
	page := b.get(t, "/console/events")
	require.Contains(t, page.body, "ERR the test refused &lt;this&gt;")
	require.Contains(t, page.body, fmt.Sprintf(`data-event="%d"`, first))
	token := b.token(t, "/console/events")
	res := b.post(t, "/console/events/unpark", url.Values{"csrf": {token}, "ids": {strconv.FormatInt(first, 10)}})
	require.Equal(t, http.StatusSeeOther, res.status, res.body)
	require.Contains(t, b.get(t, res.header.Get("Location")).body, "1 event(s) back")
	var parked []int64
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM outbox WHERE parked_at IS NOT NULL`)
	require.NoError(t, err)
	parked, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{second}, parked)
	var attempts int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT attempts FROM outbox WHERE id = $1`, first).Scan(&attempts))
	require.Zero(t, attempts)
	require.Equal(t, http.StatusBadRequest, b.post(t, "/console/events/unpark", url.Values{"csrf": {token}, "ids": {"x"}}).status)
}

func TestKeyListPagesThroughEveryKeyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// 130 keys in three scopes, one in ten failed, through SQL: the list
	// reads rows, whoever wrote them.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, expires_at)
		SELECT 'acct_' || (i % 3), 'key-' || lpad(i::text, 4, '0'), CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'completed' END, 1, 'v1:x',
			CASE WHEN i % 10 = 0 THEN NULL ELSE 200 END, now() + interval '1 hour'
		FROM generate_series(1, 130) i`)
	require.NoError(t, err)
	walk := func(path string) []string {
		var keys []string
		for page := 0; path != ""; page++ {
			require.Less(t, page, 20)
			res := b.get(t, path)
			require.Equal(t, http.StatusOK, res.status, res.body)
			for _, m := range regexp.MustCompile(`<td>(acct_\d)</td><td class="key"><a [^>]*>([^<]+)</a></td><td>(\w+)</td>`).FindAllStringSubmatch(res.body, -1) {
				keys = append(keys, m[1]+"/"+m[2]+"/"+m[3])
			}
			next := regexp.MustCompile(`<a href="([^"]+)" rel="next">`).FindStringSubmatch(res.body)
			path = ""
			if next != nil {
				path = strings.ReplaceAll(next[1], "&amp;", "&")
			}
		}
		return keys
	}
	all := walk("/console/keys")
	require.Len(t, all, 130)
	require.True(t, slices.IsSorted(all), "in (scope, key) order")
	require.Len(t, slices.Compact(slices.Clone(all)), 130, "each once")

	scoped := walk("/console/keys?scope=acct_1")
	require.Len(t, scoped, 44)
	for _, k := range scoped {
		require.True(t, strings.HasPrefix(k, "acct_1/"))
	}
	failed := walk("/console/keys?state=failed")
	require.Len(t, failed, 13)
	prefixed := walk("/console/keys?scope=acct_2&prefix=key-01")
	require.Len(t, prefixed, 10) // key-0101, key-0104, … key-0128
	require.Equal(t, "acct_2/key-0101/completed", prefixed[0])
	for _, k := range prefixed {
		require.Contains(t, k, "acct_2/key-01")
	}
	require.Len(t, walk("/console/keys?prefix=key-012"), 10, "a prefix across scopes: key-0120 … key-0129")
	require.Equal(t, http.StatusBadRequest, b.get(t, "/console/keys?prefix=%20").status, "no key holds a space")
	require.Equal(t, http.StatusBadRequest, b.get(t, "/console/keys?state=done").status)
}

func TestKeyListBoundsItsWalk(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// 2,500 completed keys, then one failed: a page filtered by state walks
	// at most 2,000 keys, ends early, and the next one finds it.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, expires_at)
		SELECT 'acct_a', 'key-' || lpad(i::text, 5, '0'), CASE WHEN i = 2600 THEN 'failed' ELSE 'completed' END, 1, 'v1:x',
			CASE WHEN i = 2600 THEN NULL ELSE 200 END, now() + interval '1 hour'
		FROM generate_series(1, 2600) i`)
	require.NoError(t, err)
	first := b.get(t, "/console/keys?state=failed")
	require.Equal(t, http.StatusOK, first.status)
	require.NotContains(t, first.body, "key-02600")
	require.Contains(t, first.body, "searched the next 2,000 keys")
	next := regexp.MustCompile(`<a href="([^"]+)" rel="next">search on`).FindStringSubmatch(first.body)
	require.NotNil(t, next)
	second := b.get(t, strings.ReplaceAll(next[1], "&amp;", "&"))
	require.Contains(t, second.body, "key-02600")
	require.NotContains(t, second.body, `rel="next"`)
}

func TestOverviewAnswersTheOnCallQuestions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	require.NoError(t, b.console.Start(b.ctx))
	t.Cleanup(b.console.Stop)
	b.complete(t, "k1", "{}")
	b.complete(t, "k1", "{}") // a replay
	b.fail(t, "k2")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO outbox (scope, key, version, created_at) VALUES ('acct_a', 'k9', 1, now() - interval '90 seconds')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO reconcile_passes (started_at, finished_at, result, report)
		VALUES (now() - interval '2 minutes', now() - interval '119 seconds', 'ok', '{"scanned":2,"missing":1,"stale":2,"repaired":3}'),
		       (now() - interval '1 minute', now() - interval '59 seconds', 'failed', '{}')`)
	require.NoError(t, err)

	page := b.get(t, "/console/")
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Contains(t, page.body, `data-figure="last-pass">failed, 59s ago`)
	require.Regexp(t, `data-figure="pending">\d+<`, page.body)
	require.Regexp(t, `oldest waiting</dt><dd[^>]*>\d+m?s`, page.body)
	require.Regexp(t, `<tr data-state="completed"><td><a [^>]*>completed</a></td><td>1</td>`, page.body)
	require.Regexp(t, `<tr data-state="failed"><td><a [^>]*>failed</a></td><td>1</td>`, page.body)
	require.Contains(t, page.body, `class="mark"`, "the failed pass in the drift chart")
	require.Contains(t, page.body, "<svg", "charts drawn on the server")
	require.Contains(t, page.body, "replayed_cache <b>1</b>")
	require.Contains(t, page.body, "executed <b>1</b>")
}

// TestOverviewColoursByThresholds: the oldest waiting event and the stuck
// executions are coloured as the shipped alert rules would fire, or by the
// thresholds the console is given.
func TestOverviewColoursByThresholds(t *testing.T) {
	t.Parallel()
	seed := func(t *testing.T, b *testBundle) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `INSERT INTO outbox (scope, key, version, created_at) VALUES
			('acct_a', 'k9', 1, now() - interval '90 seconds'), ('acct_a', 'k8', 1, now() - interval '3 seconds')`)
		require.NoError(t, err)
		// An execution that started a step, its lease over 11 minutes ago.
		_, err = b.pool.Exec(b.ctx, `INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, owner,
				lease_expires_at, handler, steps, expires_at)
			VALUES ('acct_a', 'k-stuck', 'in_progress', 1, 'v1:x', gen_random_uuid(), now() - interval '11 minutes',
				'gone', '{}', now() + interval '1 hour')`)
		require.NoError(t, err)
	}
	levels := func(t *testing.T, b *testBundle) (backlog, oldest, stuck string, body string) {
		t.Helper()
		page := b.get(t, "/console/")
		require.Equal(t, http.StatusOK, page.status, page.body)
		find := func(figure string) string {
			m := regexp.MustCompile(`data-figure="` + figure + `"[^>]*data-level="([a-z]*)"`).FindStringSubmatch(page.body)
			require.NotNil(t, m, figure)
			return m[1]
		}
		return find("backlog"), find("oldest-pending"), find("awaiting-resumption"), page.body
	}

	b := setup(t, setupOpts{})
	seed(t, b)
	backlog, oldest, stuck, body := levels(t, b)
	require.Contains(t, body, `data-figure="backlog" data-level="alert">2 waiting, oldest 1m30s</p>`)
	require.Equal(t, "alert", backlog, "over a minute: OnceonlyRelayBehind")
	require.Equal(t, "alert", oldest)
	require.Equal(t, "alert", stuck, "over 10 minutes: OnceonlyStuckExecutions")
	require.Regexp(t, `<tr class="over alert"><td><a [^>]*>acct_a / k-stuck</a>`, body)

	b = setup(t, setupOpts{thresholds: console.Thresholds{PendingWarn: time.Minute, PendingAlert: time.Hour, StuckWarn: time.Minute, StuckAlert: time.Hour}})
	seed(t, b)
	backlog, _, stuck, body = levels(t, b)
	require.Equal(t, "warn", backlog)
	require.Equal(t, "warn", stuck)
	require.Regexp(t, `<tr class="over warn"><td><a [^>]*>acct_a / k-stuck</a>`, body)

	b = setup(t, setupOpts{thresholds: console.Thresholds{PendingWarn: time.Hour, PendingAlert: 2 * time.Hour, StuckWarn: time.Hour, StuckAlert: 2 * time.Hour}})
	seed(t, b)
	backlog, _, stuck, body = levels(t, b)
	require.Empty(t, backlog)
	require.Empty(t, stuck)
	require.Regexp(t, `<tr class="over"><td><a [^>]*>acct_a / k-stuck</a>`, body)

	b = setup(t, setupOpts{})
	require.Contains(t, b.get(t, "/console/").body, `data-figure="backlog" data-level="">none waiting</p>`)
}

// TestKeyPageShowsTheRedisLease: an in-progress value holds its lease
// deadline, and the key page shows it beside Postgres's.
func TestKeyPageShowsTheRedisLease(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.holdInStep(t, "k-held", "req", "ch_1")
	oncetest.Eventually(t, 10*time.Second, "an in-progress value in Redis", func() bool {
		v, err := b.rdb.Get(b.ctx, b.redisKey("k-held")).Result()
		return err == nil && strings.HasPrefix(v, "in_progress:")
	})
	page := b.get(t, keyPath(scope, "k-held"))
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Regexp(t, `data-field="lease"><th>lease</th><td class="pg">in \d+m?s</td><td class="redis">in \d+m?s</td>`, page.body)
}

// TestAFailedPassCountsInTheChartAsInTheTable: a failed pass's report holds
// what it found before it failed; the table of the last pass shows it, and
// the chart's legend counts it too.
func TestAFailedPassCountsInTheChartAsInTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO reconcile_passes (started_at, finished_at, result, report, error)
		VALUES (now() - interval '2 minutes', now() - interval '119 seconds', 'ok', '{"scanned":2,"missing":1,"stale":2}', ''),
		       (now() - interval '1 minute', now() - interval '59 seconds', 'failed', '{"scanned":9,"missing":1,"corrupt":3}', 'reconcile: Redis went away')`)
	require.NoError(t, err)
	page := b.get(t, "/console/")
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Contains(t, page.body, `data-figure="last-pass">failed, 59s ago`)
	require.Contains(t, page.body, `<caption>Found by the last pass before it failed</caption>`)
	require.Regexp(t, `<tr><td>1</td><td>0</td><td>0</td><td>3</td><td>0</td>`, page.body, "the table: the failed pass's missing 1, corrupt 3")
	for kind, total := range map[string]int{"missing": 2, "stale": 2, "wrong state": 0, "corrupt": 3, "orphaned": 0} {
		require.Contains(t, page.body, fmt.Sprintf(`</span>%s <b>%d</b></span>`, kind, total), "the legend's %s", kind)
	}
	require.Regexp(t, `class="d-corrupt"><title>[^<]*failed: reconcile: Redis went away — corrupt: 3</title>`, page.body)
	require.Contains(t, page.body, `class="mark"`)
}

func TestAGetNeverWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "k1", "{}")
	b.complete(t, "k-missing", "{}")
	b.complete(t, "k-differs", "{}")
	b.fail(t, "k2")
	b.holdInStep(t, "k-held", "req", "ch_1")
	require.NoError(t, b.rdb.Del(b.ctx, b.redisKey("k-missing")).Err())
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("k-differs"), "garbage", time.Hour).Err())
	require.NoError(t, b.rdb.Set(b.ctx, b.redisKey("k-orphan"), "failed:4:", time.Hour).Err())
	insertParked(t, b, "k1")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO reconcile_passes (started_at, result, report) VALUES (now(), 'ok', '{}')`)
	require.NoError(t, err)

	before := snapshot(t, b)
	for _, path := range []string{
		"/console/", "/console", "/console/keys", "/console/keys?state=in_progress", "/console/keys?scope=acct_a&prefix=k",
		keyPath("acct_a", "k1"), keyPath("acct_a", "k2"), keyPath("acct_a", "k-missing"), keyPath("acct_a", "k-differs"),
		keyPath("acct_a", "k-orphan"), keyPath("acct_a", "k-held"), keyPath("acct_a", "none"),
		keyPath("acct_a", "k1") + "/purge", keyPath("acct_a", "k-held") + "/purge", keyPath("acct_a", "k1") + "?repaired=1",
		"/console/events", "/console/static/console.css",
	} {
		res := b.get(t, path)
		require.Less(t, res.status, 500, path)
	}
	require.Equal(t, before, snapshot(t, b), "no row, Redis value or TTL changed")
}

// snapshot returns every row of the schema's tables and every Redis value
// under the test's prefix with its absolute expiry (PEXPIRETIME), so a TTL
// set again shows.
func snapshot(t *testing.T, b *testBundle) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT 'k ' || t::text FROM idempotency_keys t UNION ALL SELECT 'o ' || t::text FROM outbox t
		UNION ALL SELECT 'p ' || t::text FROM payments t UNION ALL SELECT 'r ' || t::text FROM reconcile_passes t
		UNION ALL SELECT 'f ' || t::text FROM idempotency_version_floor t`)
	require.NoError(t, err)
	state, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	iter := b.rdb.Scan(b.ctx, 0, b.prefix+"*", 100).Iterator()
	for iter.Next(b.ctx) {
		name := iter.Val()
		value, err := b.rdb.Get(b.ctx, name).Result()
		require.NoError(t, err)
		expiry, err := b.rdb.PExpireTime(b.ctx, name).Result()
		require.NoError(t, err)
		state = append(state, fmt.Sprintf("redis %s %q %d", name, value, expiry))
	}
	require.NoError(t, iter.Err())
	slices.Sort(state)
	return state
}

func TestNewChecksItsConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, cfg := range []console.Config{
		{Pool: b.pool, Auth: "a:b"},
		{Engine: b.engine, Auth: "a:b"},
		{Engine: b.engine, Pool: b.pool},
		{Engine: b.engine, Pool: b.pool, Auth: "nocolon"},
		{Engine: b.engine, Pool: b.pool, Auth: ":pass"},
		{Engine: b.engine, Pool: b.pool, Auth: "user:"},
		{Engine: b.engine, Pool: b.pool, Auth: "a:b", Prefix: "console"},
		{Engine: b.engine, Pool: b.pool, Auth: "a:b", Authorize: func(*http.Request) (string, bool) { return "", true }},
	} {
		_, err := console.New(cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

// TestPathsAndFiltersAreValidated: the scope and the key in a path, and the
// key list's filters, are checked as the engine checks them, so a bad one
// is a 400 (a well-formed absent key a 404), never a 500: a ':' in the
// scope cannot reach another key's Redis value (acct_a%3Ax/y is not key
// "x:y" of acct_a, whose value Repair would delete), nor can NUL or
// invalid UTF-8 reach Postgres.
func TestPathsAndFiltersAreValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.complete(t, "x:y", "{}")
	token := b.token(t, keyPath(scope, "x:y")+"/purge")
	for _, c := range []struct {
		name, path string
		want       int
	}{
		{"scope with ':'", "/console/keys/acct_a%3Ax/y", http.StatusBadRequest},
		{"scope with NUL", "/console/keys/acct%00/k", http.StatusBadRequest},
		{"scope not UTF-8", "/console/keys/acct%FF/k", http.StatusBadRequest},
		{"key with NUL", "/console/keys/acct_a/k%00", http.StatusBadRequest},
		{"key not UTF-8", "/console/keys/acct_a/k%FF", http.StatusBadRequest},
		{"key with a space", "/console/keys/acct_a/a%20b", http.StatusBadRequest},
		{"absent key", "/console/keys/acct_a/absent", http.StatusNotFound},
		{"filter scope with ':'", "/console/keys?scope=acct_a%3Ax", http.StatusBadRequest},
		{"filter scope with NUL", "/console/keys?scope=%00", http.StatusBadRequest},
		{"filter scope not UTF-8", "/console/keys?scope=%FF", http.StatusBadRequest},
		{"filter prefix with NUL", "/console/keys?prefix=%00", http.StatusBadRequest},
		{"filter prefix not UTF-8", "/console/keys?prefix=%FF", http.StatusBadRequest},
		{"cursor scope with NUL", "/console/keys?after_scope=%00&after_key=k", http.StatusBadRequest},
		{"cursor key not UTF-8", "/console/keys?after_scope=acct_a&after_key=%FF", http.StatusBadRequest},
	} {
		require.Equal(t, c.want, b.get(t, c.path).status, "%s: %s", c.name, c.path)
		if !strings.HasPrefix(c.path, "/console/keys/") {
			continue
		}
		require.Equal(t, c.want, b.get(t, c.path+"/purge").status, "%s: %s/purge", c.name, c.path)
		purge := b.post(t, c.path+"/purge", url.Values{"csrf": {token}, "confirm": {"yes"}, "force": {"yes"}})
		require.Equal(t, c.want, purge.status, "%s: POST %s/purge", c.name, c.path)
		if c.want == http.StatusBadRequest { // an absent key's repair changes nothing: 303 to its page
			repair := b.post(t, c.path+"/repair", url.Values{"csrf": {token}})
			require.Equal(t, c.want, repair.status, "%s: POST %s/repair", c.name, c.path)
		}
	}
	require.Equal(t, int64(1), b.rdb.Exists(b.ctx, b.redisKey("x:y")).Val(), "key x:y's Redis value is untouched")
	require.Equal(t, 1, b.rows(t, "x:y"))
}

// TestDotKeysAreLinkedToTheirPages: keys (and scopes) "." and ".." are
// valid; the key list links them escaped (%2E), and the links reach their
// pages through the real handler, where ServeMux would otherwise clean
// them away with a redirect.
func TestDotKeysAreLinkedToTheirPages(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, ref := range [][2]string{{scope, "."}, {scope, ".."}, {".", "k"}, {"..", ".."}} {
		_, err := b.engine.Do(b.ctx, ref[0], ref[1], []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			return onceonly.Result{Status: 201, Body: []byte("{}")}, nil
		})
		require.NoError(t, err)
		list := b.get(t, "/console/keys?"+url.Values{"scope": {ref[0]}}.Encode())
		require.Equal(t, http.StatusOK, list.status, list.body)
		links := regexp.MustCompile(`<td class="key"><a href="([^"]+)">([^<]+)</a>`).FindAllStringSubmatch(list.body, -1)
		var link string
		for _, l := range links {
			if l[2] == ref[1] {
				link = l[1]
			}
		}
		require.NotEmpty(t, link, "%q/%q is listed with a link", ref[0], ref[1])
		page := b.get(t, link)
		require.Equal(t, http.StatusOK, page.status, "%q/%q: %s (Location %q)", ref[0], ref[1], link, page.header.Get("Location"))
		require.Contains(t, page.body, `data-sync="`, "the key page of %q/%q", ref[0], ref[1])
		require.Equal(t, http.StatusOK, b.get(t, link+"/purge").status, "the purge confirmation of %q/%q", ref[0], ref[1])
	}
}
