package gateway_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("beside the engine's schema", func(t *testing.T) {
		t.Parallel()
		pool := oncetest.DB(t)
		ctx := oncetest.Context(t)
		engineVersion := func() (v int64) {
			require.NoError(t, pool.QueryRow(ctx, `SELECT max(version_id) FROM public.onceonly_db_version`).Scan(&v))
			return v
		}
		before := engineVersion()

		// Several gateway processes starting at once.
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Go(func() { errs[i] = gateway.Migrate(ctx, pool) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, gateway.Migrate(ctx, pool), "migrating again is a no-op")

		require.Equal(t, before, engineVersion(), "the engine's version table is untouched")
		var version int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT max(version_id) FROM gateway.goose_db_version`).Scan(&version))
		require.EqualValues(t, 2, version)
		var tables []string
		rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'gateway' ORDER BY 1`)
		require.NoError(t, err)
		for rows.Next() {
			var name string
			require.NoError(t, rows.Scan(&name))
			tables = append(tables, name)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{"charges", "goose_db_version", "goose_lock"}, tables)
	})

	t.Run("on an empty database", func(t *testing.T) {
		t.Parallel()
		pool := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
		ctx := oncetest.Context(t)
		require.NoError(t, gateway.Migrate(ctx, pool))
		var public int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&public))
		require.Zero(t, public, "nothing is created outside schema gateway")
	})
}

func TestChargeAndReplay(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{})

	first := post(t, g.URL, "k-visa", chargeBody(1250, "tok_visa", "acct_1/order-1"))
	require.Equal(t, http.StatusCreated, first.Code, first.Body)
	require.Equal(t, "application/json", first.Header.Get("Content-Type"))
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	var c gateway.Charge
	require.NoError(t, json.Unmarshal([]byte(first.Body), &c))
	require.True(t, strings.HasPrefix(c.ID, "ch_"), c.ID)
	require.Equal(t, gateway.Charge{ID: c.ID, Status: "succeeded", Amount: 1250, Currency: "usd", Source: "tok_visa",
		Reference: "acct_1/order-1", Created: c.Created}, c)
	created, err := time.Parse(time.RFC3339, c.Created)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), created, time.Minute)

	again := post(t, g.URL, "k-visa", chargeBody(1250, "tok_visa", "acct_1/order-1"))
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, first.Body, again.Body, "a replay is byte-identical")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))

	got, err := g.Client.Charge(oncetest.Context(t), "k-visa", gateway.ChargeRequest{Amount: 1250, Currency: "usd", Source: "tok_visa", Reference: "acct_1/order-1"})
	require.NoError(t, err)
	require.Equal(t, c, got)

	// Declined, replayed.
	{
		declined := post(t, g.URL, "k-declined", chargeBody(990, "tok_chargeDeclined", "acct_1/order-2"))
		require.Equal(t, http.StatusPaymentRequired, declined.Code, declined.Body)
		require.Contains(t, declined.Body, `"status":"declined"`)
		replay := post(t, g.URL, "k-declined", chargeBody(990, "tok_chargeDeclined", "acct_1/order-2"))
		require.Equal(t, http.StatusPaymentRequired, replay.Code)
		require.Equal(t, declined.Body, replay.Body)

		ch, err := g.Client.Charge(oncetest.Context(t), "k-declined", gateway.ChargeRequest{Amount: 990, Currency: "usd", Source: "tok_chargeDeclined", Reference: "acct_1/order-2"})
		require.NoError(t, err, "a decline is a final answer, not an error")
		require.Equal(t, "declined", ch.Status)
		require.Equal(t, "declined", readRow(t, pool, "k-declined").Status)
	}

	require.Equal(t, 2, countRows(t, pool))
	require.EqualValues(t, 1, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
	require.EqualValues(t, 1, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "declined"}))
	require.EqualValues(t, 3, counter(t, g.Reg, "gateway_requests_total", map[string]string{"code": "201"}))
	require.EqualValues(t, 3, counter(t, g.Reg, "gateway_requests_total", map[string]string{"code": "402"}))
}

// TestOneChargePerKey sends 30 identical calls at once through two handlers
// on two pools (two gateway processes): one charge, every answer the same
// or 409.
func TestOneChargePerKey(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"tok_visa", "tok_slow", "tok_chargeDeclined"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			url := oncetest.DatabaseURL(t)
			pools := []*pgxpool.Pool{oncetest.Pool(t, url), oncetest.Pool(t, url)}
			require.NoError(t, gateway.Migrate(oncetest.Context(t), pools[0]))
			cfg := gateway.Config{SlowDelay: 300 * time.Millisecond}
			gws := []*gw{serve(t, pools[0], cfg), serve(t, pools[1], cfg)}

			const n = 30
			answers := make([]answer, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					answers[i] = post(t, gws[i%2].URL, "same-key", chargeBody(500, source, "acct/same-key"))
				})
			}
			close(start)
			wg.Wait()

			want := http.StatusCreated
			if source == "tok_chargeDeclined" {
				want = http.StatusPaymentRequired
			}
			var finals []string
			for _, a := range answers {
				switch a.Code {
				case want:
					finals = append(finals, a.Body)
				case http.StatusConflict:
					require.Equal(t, "1", a.Header.Get("Retry-After"))
					require.Contains(t, a.Body, "idempotency_key_in_use")
				default:
					t.Fatalf("unexpected answer %d: %s", a.Code, a.Body)
				}
			}
			require.NotEmpty(t, finals, "the call that owned the key answered")
			for _, b := range finals {
				require.Equal(t, finals[0], b)
			}
			require.Equal(t, 1, countRows(t, pools[0]))
			var charges float64
			for _, g := range gws {
				charges += counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}) +
					counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "declined"})
			}
			require.EqualValues(t, 1, charges)

			// Once final, every call gets the same answer.
			later := post(t, gws[1].URL, "same-key", chargeBody(500, source, "acct/same-key"))
			require.Equal(t, want, later.Code)
			require.Equal(t, finals[0], later.Body)
		})
	}
}

func TestKeyReusedWithOtherParameters(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{})
	ctx := oncetest.Context(t)
	base := gateway.ChargeRequest{Amount: 700, Currency: "eur", Source: "tok_visa", Reference: "acct/reuse"}
	first, err := g.Client.Charge(ctx, "reuse", base)
	require.NoError(t, err)

	for name, change := range map[string]func(*gateway.ChargeRequest){
		"amount":    func(r *gateway.ChargeRequest) { r.Amount = 701 },
		"currency":  func(r *gateway.ChargeRequest) { r.Currency = "usd" },
		"source":    func(r *gateway.ChargeRequest) { r.Source = "tok_chargeDeclined" },
		"reference": func(r *gateway.ChargeRequest) { r.Reference = "acct/other" },
	} {
		req := base
		change(&req)
		_, err := g.Client.Charge(ctx, "reuse", req)
		require.ErrorIs(t, err, gateway.ErrKeyReused, name)
		require.NotErrorIs(t, err, gateway.ErrUnknownOutcome, name)
	}
	raw := post(t, g.URL, "reuse", chargeBody(1, "tok_visa", "acct/reuse"))
	require.Equal(t, http.StatusUnprocessableEntity, raw.Code)
	require.Contains(t, raw.Body, `"code":"idempotency_key_reused"`)

	again, err := g.Client.Charge(ctx, "reuse", base)
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, 1, countRows(t, pool))
}

func TestGatewayErrorChargesNothing(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{})
	for range 2 {
		a := post(t, g.URL, "err-key", chargeBody(100, "tok_gatewayError", "acct/err-key"))
		require.Equal(t, http.StatusInternalServerError, a.Code)
		require.Contains(t, a.Body, `"code":"gateway_error"`)
	}
	_, err := g.Client.Charge(oncetest.Context(t), "err-key", gateway.ChargeRequest{Amount: 100, Currency: "usd", Source: "tok_gatewayError", Reference: "acct/err-key"})
	require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
	require.Zero(t, countRows(t, pool))
	list, err := g.Client.Lookup(oncetest.Context(t), "acct/err-key")
	require.NoError(t, err)
	require.Empty(t, list.Data)
	require.Zero(t, list.InFlight)
	require.EqualValues(t, 3, counter(t, g.Reg, "gateway_requests_total", map[string]string{"code": "500"}))
}

func TestSlowChargeAndInFlight(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	const delay = time.Second
	g := serve(t, pool, gateway.Config{SlowDelay: delay})
	ctx := oncetest.Context(t)
	req := gateway.ChargeRequest{Amount: 300, Currency: "usd", Source: "tok_slow", Reference: "acct/slow"}

	type result struct {
		ch  gateway.Charge
		err error
		in  time.Duration
	}
	done := make(chan result, 1)
	began := time.Now()
	go func() {
		ch, err := g.Client.Charge(ctx, "slow", req)
		done <- result{ch, err, time.Since(began)}
	}()
	oncetest.Eventually(t, 5*time.Second, "the slow call owns its key", func() bool {
		return readRow(t, pool, "slow").Status == "processing"
	})

	busy := post(t, g.URL, "slow", chargeBody(300, "tok_slow", "acct/slow"))
	require.Equal(t, http.StatusConflict, busy.Code, busy.Body)
	require.Equal(t, "1", busy.Header.Get("Retry-After"))
	_, err := g.Client.Charge(ctx, "slow", req)
	var inFlight *gateway.InFlightError
	require.ErrorAs(t, err, &inFlight)
	require.Equal(t, time.Second, inFlight.RetryAfter)
	require.ErrorIs(t, err, gateway.ErrUnknownOutcome)

	r := <-done
	require.NoError(t, r.err)
	require.GreaterOrEqual(t, r.in, delay)
	require.Equal(t, "succeeded", r.ch.Status)

	replayed, err := g.Client.Charge(ctx, "slow", req)
	require.NoError(t, err)
	require.Equal(t, r.ch, replayed)
}

// TestSlowCallFinishesWithoutItsClient: a tok_slow call whose client gives
// up before the delay still charges, once, at its time, as a real gateway's
// call does: a retry meanwhile finds it in flight, a retry after gets the
// charge replayed.
func TestSlowCallFinishesWithoutItsClient(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{SlowDelay: 2 * time.Second})
	req := gateway.ChargeRequest{Amount: 300, Currency: "usd", Source: "tok_slow", Reference: "acct/gone"}

	ctx, cancel := context.WithCancel(oncetest.Context(t))
	gone := make(chan error, 1)
	go func() {
		_, err := g.Client.Charge(ctx, "gone", req)
		gone <- err
	}()
	oncetest.Eventually(t, 5*time.Second, "the call owns its key", func() bool { return readRow(t, pool, "gone").Found })
	cancel() // the client goes away
	err := <-gone
	require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
	require.ErrorIs(t, err, context.Canceled)
	_, err = g.Client.Charge(oncetest.Context(t), "gone", req)
	var inFlight *gateway.InFlightError
	require.ErrorAs(t, err, &inFlight, "the call goes on without its client")

	oncetest.Eventually(t, 5*time.Second, "the call charged", func() bool { return readRow(t, pool, "gone").Status == "succeeded" })
	ch, err := g.Client.Charge(oncetest.Context(t), "gone", req)
	require.NoError(t, err)
	require.Equal(t, readRow(t, pool, "gone").ChargeID, ch.ID, "the retry gets the charge the call made")
	require.EqualValues(t, 1, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
}

// TestStoppingCutsSlowCallsShort: a shutdown (Config.Stopping) cuts a
// tok_slow call short before its charge: it charges nothing and gives its
// key up at once, so the next call runs at once.
func TestStoppingCutsSlowCallsShort(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	stopping := make(chan struct{})
	g := serve(t, pool, gateway.Config{SlowDelay: time.Minute, Stopping: stopping})
	req := gateway.ChargeRequest{Amount: 300, Currency: "usd", Source: "tok_slow", Reference: "acct/cut"}

	done := make(chan error, 1)
	go func() {
		_, err := g.Client.Charge(oncetest.Context(t), "cut", req)
		done <- err
	}()
	oncetest.Eventually(t, 5*time.Second, "the slow call owns its key", func() bool { return readRow(t, pool, "cut").Found })
	close(stopping)
	err := <-done
	require.ErrorIs(t, err, gateway.ErrUnavailable, "cut short: 503")
	require.False(t, readRow(t, pool, "cut").Found, "the key given up")
	require.Zero(t, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
}

func TestLatency(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{Latency: 300 * time.Millisecond})
	began := time.Now()
	bad := post(t, g.URL, "", chargeBody(1, "tok_visa", "a/b"))
	require.Equal(t, http.StatusBadRequest, bad.Code)
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond, "every call waits the latency first")
	began = time.Now()
	_, err := g.Client.Charge(oncetest.Context(t), "lat", gateway.ChargeRequest{Amount: 1, Currency: "usd", Source: "tok_visa", Reference: "a/lat"})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
}

func TestLookup(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	stopping := make(chan struct{})
	g := serve(t, pool, gateway.Config{SlowDelay: 30 * time.Second, Stopping: stopping})
	t.Cleanup(func() { close(stopping) }) // cuts the slow call short before the server closes
	ctx := oncetest.Context(t)
	const ref = "acct_9/key with spaces&x=1/é"

	declined, err := g.Client.Charge(ctx, "step-1", gateway.ChargeRequest{Amount: 10, Currency: "usd", Source: "tok_chargeDeclined", Reference: ref})
	require.NoError(t, err)
	succeeded, err := g.Client.Charge(ctx, "step-2", gateway.ChargeRequest{Amount: 10, Currency: "usd", Source: "tok_visa", Reference: ref})
	require.NoError(t, err)
	_, err = g.Client.Charge(ctx, "other", gateway.ChargeRequest{Amount: 10, Currency: "usd", Source: "tok_visa", Reference: "acct_9/other"})
	require.NoError(t, err)
	// A call still in flight for the reference is not a charge (yet).
	slowCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = g.Client.Charge(slowCtx, "step-3", gateway.ChargeRequest{Amount: 10, Currency: "usd", Source: "tok_slow", Reference: ref})
	}()
	oncetest.Eventually(t, 5*time.Second, "the slow call in flight", func() bool { return readRow(t, pool, "step-3").Found })

	list, err := g.Client.Lookup(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, []gateway.Charge{declined, succeeded}, list.Data)
	require.Equal(t, 1, list.InFlight, "the slow call may charge yet")

	none, err := g.Client.Lookup(ctx, "acct_9/nothing")
	require.NoError(t, err)
	require.NotNil(t, none.Data)
	require.Empty(t, none.Data)
	raw := do(t, http.MethodGet, g.URL+"/v1/charges?reference=acct_9%2Fnothing", nil, "")
	require.Equal(t, http.StatusOK, raw.Code)
	require.JSONEq(t, `{"data":[],"in_flight":0}`, raw.Body)

	missing := do(t, http.MethodGet, g.URL+"/v1/charges", nil, "")
	require.Equal(t, http.StatusBadRequest, missing.Code)
	require.Contains(t, missing.Body, `"param":"reference"`)
	_, err = g.Client.Lookup(ctx, "")
	require.Error(t, err)
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	g := serve(t, pool, gateway.Config{})
	good := chargeBody(100, "tok_visa", "acct/bad")
	json := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "bad-1"}
	with := func(k, v string) map[string]string {
		h := maps.Clone(json)
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	cases := []struct {
		name   string
		method string
		header map[string]string
		body   string
		code   int
		want   string
	}{
		{"no key", "POST", with("Idempotency-Key", ""), good, 400, "idempotency_key_missing"},
		{"key too long", "POST", with("Idempotency-Key", strings.Repeat("k", 256)), good, 400, "idempotency_key_invalid"},
		{"key with a space", "POST", with("Idempotency-Key", "a b"), good, 400, "idempotency_key_invalid"},
		{"key not ASCII", "POST", with("Idempotency-Key", "clé"), good, 400, "idempotency_key_invalid"},
		{"no content type", "POST", with("Content-Type", ""), good, 415, "unsupported_media_type"},
		{"text body", "POST", with("Content-Type", "text/plain"), good, 415, "unsupported_media_type"},
		{"not JSON", "POST", json, "{", 400, "invalid_json"},
		{"an array", "POST", json, "[1]", 400, "invalid_json"},
		{"trailing data", "POST", json, good + "{}", 400, "invalid_json"},
		{"no amount", "POST", json, `{"currency":"usd","source":"tok_visa","reference":"a/b"}`, 400, `"param":"amount"`},
		{"zero amount", "POST", json, chargeBody(0, "tok_visa", "a/b"), 400, `"param":"amount"`},
		{"negative amount", "POST", json, chargeBody(-5, "tok_visa", "a/b"), 400, `"param":"amount"`},
		{"fractional amount", "POST", json, `{"amount":1.5,"currency":"usd","source":"tok_visa","reference":"a/b"}`, 400, `"param":"amount"`},
		{"string amount", "POST", json, `{"amount":"1","currency":"usd","source":"tok_visa","reference":"a/b"}`, 400, `"param":"amount"`},
		{"upper-case currency", "POST", json, `{"amount":1,"currency":"USD","source":"tok_visa","reference":"a/b"}`, 400, `"param":"currency"`},
		{"no source", "POST", json, `{"amount":1,"currency":"usd","reference":"a/b"}`, 400, `"param":"source"`},
		{"unknown source", "POST", json, chargeBody(1, "tok_mastercard", "a/b"), 400, `"param":"source"`},
		{"empty reference", "POST", json, chargeBody(1, "tok_visa", ""), 400, `"param":"reference"`},
		{"NUL in reference", "POST", json, chargeBody(1, "tok_visa", `a\u0000b`), 400, `"param":"reference"`},
		{"unknown field", "POST", json, `{"amount":1,"currency":"usd","source":"tok_visa","reference":"a/b","extra":1}`, 400, `"param":"extra"`},
		{"too large", "POST", json, `{"reference":"` + strings.Repeat("x", 64<<10) + `"}`, 413, "request_too_large"},
		{"wrong method", "PUT", json, good, 405, "method_not_allowed"},
		{"wrong path", "POST", json, good, 404, "not_found"},
	}
	for _, tc := range cases {
		path := "/v1/charges"
		if tc.name == "wrong path" {
			path = "/v1/refunds"
		}
		a := do(t, tc.method, g.URL+path, tc.header, tc.body)
		require.Equal(t, tc.code, a.Code, "%s: %s", tc.name, a.Body)
		require.Contains(t, a.Body, tc.want, tc.name)
		require.Equal(t, "application/json", a.Header.Get("Content-Type"), tc.name)
	}
	require.Zero(t, countRows(t, pool), "a refused call claims nothing")

	_, err := g.Client.Charge(oncetest.Context(t), "bad-2", gateway.ChargeRequest{Amount: 1, Currency: "usd", Source: "tok_amex", Reference: "a/b"})
	require.Error(t, err)
	require.NotErrorIs(t, err, gateway.ErrUnknownOutcome, "a 400 is the caller's bug, not an unknown outcome")
	require.NotErrorIs(t, err, gateway.ErrKeyReused)
	require.Contains(t, err.Error(), "400")
}

func TestStartInProcess(t *testing.T) {
	t.Parallel()
	pool := oncetest.Pool(t, oncetest.EmptyDatabaseURL(t))
	ctx := oncetest.Context(t)
	base, stop, err := gateway.StartInProcess(ctx, gateway.Config{Pool: pool, Faults: gateway.Faults{ChargeThenHang: 1}, Hang: time.Minute})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(base, "http://127.0.0.1:"), base)
	c := &gateway.Client{BaseURL: base}

	errc := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, "inproc", gateway.ChargeRequest{Amount: 1, Currency: "usd", Source: "tok_visa", Reference: "a/inproc"})
		errc <- err
	}()
	oncetest.Eventually(t, 5*time.Second, "the charge made", func() bool { return readRow(t, pool, "inproc").Status == "succeeded" })

	began := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, stop(sctx), "stop cuts the hanging call")
	require.Less(t, time.Since(began), 3*time.Second)
	require.ErrorIs(t, <-errc, gateway.ErrUnknownOutcome)

	_, err = c.Charge(ctx, "after", gateway.ChargeRequest{Amount: 1, Currency: "usd", Source: "tok_visa", Reference: "a/after"})
	require.ErrorIs(t, err, gateway.ErrUnknownOutcome, "nothing listens any more")
}

func TestNewHandlerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	pool := migratedDB(t)
	for _, cfg := range []gateway.Config{
		{},
		{Pool: pool, Latency: -time.Second},
		{Pool: pool, Faults: gateway.Faults{ChargeThen500: 0.6, FailBeforeCharge: 0.6}},
		{Pool: pool, Faults: gateway.Faults{ChargeThenHang: -0.1}},
	} {
		_, err := gateway.NewHandler(cfg)
		require.Error(t, err)
	}
	// Two handlers on one registry: the second cannot register its metrics.
	reg := serve(t, pool, gateway.Config{}).Reg
	_, err := gateway.NewHandler(gateway.Config{Pool: pool, Registerer: reg})
	require.ErrorContains(t, err, "register metrics")
}
