package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/gateway"
	"github.com/onceonly/onceonly/internal/testenv"
	"github.com/onceonly/onceonly/payments"
)

// api starts the demo payments API on real Postgres and Redis.
func api(t *testing.T) http.Handler {
	t.Helper()
	return apiOn(t, testenv.DB(t))
}

// apiOn is api on pool.
func apiOn(t *testing.T, pool *pgxpool.Pool) http.Handler {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	return payments.NewHandler(payments.Config{
		Engine: engine, Pool: pool, APIKeys: map[string]string{"sk_test_c": "acct_c"},
		Gateway: testenv.Gateway(t, pool, gateway.Config{SlowDelay: 700 * time.Millisecond}),
		Logger:  testenv.QuietLogger(),
	})
}

func payment(srvURL, source string) client.Request {
	return client.Request{
		Method: "POST", URL: srvURL + "/v1/payments",
		Header: http.Header{"Authorization": {"Bearer sk_test_c"}},
		Body:   []byte(`{"amount":1500,"currency":"eur","customer":"cus_1","source":"` + source + `"}`),
	}
}

func fastClient() *client.Client {
	return &client.Client{MinDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}
}

func TestFirstCallThenReplay(t *testing.T) {
	srv := httptest.NewServer(api(t))
	defer srv.Close()
	c := fastClient()
	ctx := testenv.Context(t)
	req := payment(srv.URL, "tok_visa")
	first, err := c.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, 1, first.Attempts)
	require.False(t, first.Replayed)

	req.Key = first.Key
	again, err := c.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.True(t, again.Replayed)
	require.Equal(t, first.Body, again.Body)
}

func TestWaitsOutAnInFlightDuplicate(t *testing.T) {
	pool := testenv.DB(t)
	srv := httptest.NewServer(apiOn(t, pool))
	defer srv.Close()
	ctx := testenv.Context(t)
	req := payment(srv.URL, "tok_slow")
	req.Key = client.NewKey()

	var first *client.Response
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { first, firstErr = fastClient().Do(ctx, req) })
	testenv.AwaitClaimed(t, ctx, pool, req.Key)
	began := time.Now()
	second, err := fastClient().Do(ctx, req)
	require.NoError(t, err)
	wg.Wait()
	require.NoError(t, firstErr)
	require.Equal(t, http.StatusCreated, second.StatusCode)
	require.GreaterOrEqual(t, second.Attempts, 2, "the first attempt met 409")
	require.True(t, second.Replayed)
	require.Equal(t, first.Body, second.Body)
	require.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "Retry-After (1s) was honored")
}

func TestNeverRetriesOtherClientErrors(t *testing.T) {
	srv := httptest.NewServer(api(t))
	defer srv.Close()
	ctx := testenv.Context(t)
	req := payment(srv.URL, "tok_visa")
	req.Key = client.NewKey()
	_, err := fastClient().Do(ctx, req)
	require.NoError(t, err)

	changed := req
	changed.Body = []byte(`{"amount":9999,"currency":"eur","customer":"cus_1","source":"tok_visa"}`)
	res, err := fastClient().Do(ctx, changed) // another client: the server says 422
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Equal(t, 1, res.Attempts)

	declined, err := fastClient().Do(ctx, payment(srv.URL, "tok_chargeDeclined"))
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, declined.StatusCode)
	require.Equal(t, 1, declined.Attempts)
}

func TestRefusesAKeyReusedForAnotherPayload(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c := fastClient()
	req := payment(srv.URL, "tok_visa")
	req.Key = "order-42"
	_, err := c.Do(context.Background(), req)
	require.NoError(t, err)
	req.Body = []byte(`{"amount":1}`)
	_, err = c.Do(context.Background(), req)
	require.ErrorIs(t, err, client.ErrKeyReused)
	require.EqualValues(t, 1, hits.Load(), "nothing sent for the reused key")
}

func TestRetriesGatewayErrorsUpToTheLimit(t *testing.T) {
	srv := httptest.NewServer(api(t))
	defer srv.Close()
	c := fastClient()
	c.MaxAttempts = 3
	res, err := c.Do(testenv.Context(t), payment(srv.URL, "tok_gatewayError"))
	notFinal, ok := errors.AsType[*client.NotFinalError](err)
	require.True(t, ok, "a 502 is no final answer: %v", err)
	require.Same(t, res, notFinal.Response)
	require.Equal(t, http.StatusBadGateway, res.StatusCode)
	require.Equal(t, 3, res.Attempts, "a failed key runs again on every retry")
}

func TestRetriesNetworkErrorsWithTheSameKey(t *testing.T) {
	handler := api(t)
	var attempts atomic.Int32
	var keys sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys.Store(r.Header.Get(client.HeaderKey), true)
		if attempts.Add(1) <= 2 {
			// Drop the connection without an answer, as a crash would. The
			// handler's goroutine reports failures with t.Error, not require.
			hj, ok := w.(http.Hijacker)
			if !ok {
				t.Error("the ResponseWriter cannot be hijacked")
				return
			}
			conn, _, err := hj.Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
			return
		}
		handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	res, err := fastClient().Do(testenv.Context(t), payment(srv.URL, "tok_visa"))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Equal(t, 3, res.Attempts)
	n := 0
	keys.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 1, n, "every attempt carried the same key")
}

func TestStopsAtTheDeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	res, err := fastClient().Do(ctx, payment(srv.URL, "tok_visa"))
	_, notFinal := errors.AsType[*client.NotFinalError](err)
	require.True(t, notFinal, "%v", err)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "the last answer is returned")
	require.Less(t, time.Since(began), 300*time.Millisecond, "no wait past the deadline")

	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = fastClient().Do(ctx, payment(down.URL, "tok_visa"))
	require.Error(t, err)
	require.NotErrorIs(t, err, client.ErrKeyReused)
}
