package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/client"
	"github.com/onceonly/onceonly/oncetest"
)

// api serves a small payments endpoint of its own on real Postgres and
// Redis, behind onceonly's middleware: the source "tok_slow" takes 700ms,
// "tok_chargeDeclined" answers 402 and "tok_gatewayError" 502.
func api(t *testing.T) http.Handler {
	t.Helper()
	h, _ := slowAPI(t)
	return h
}

// slowAPI is api, and a channel that receives when a "tok_slow" payment
// starts.
func slowAPI(t *testing.T) (http.Handler, <-chan struct{}) {
	t.Helper()
	pool := oncetest.DB(t)
	slow := make(chan struct{}, 8)
	rdb, prefix := oncetest.Redis(t)
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(engine.Close)
	var charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Source string `json:"source"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch req.Source {
		case "tok_slow":
			slow <- struct{}{}
			time.Sleep(700 * time.Millisecond)
		case "tok_chargeDeclined":
			http.Error(w, `{"error":"card_declined"}`, http.StatusPaymentRequired)
			return
		case "tok_gatewayError":
			http.Error(w, `{"error":"gateway_error"}`, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":"pay_%d"}`, charges.Add(1))
	})
	return engine.Middleware(onceonly.MiddlewareOptions{
		Scope: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") != "Bearer sk_test_c" {
				return "", &onceonly.HTTPError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "bad API key"}
			}
			return "acct_c", nil
		},
	})(pay), slow
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
	ctx := oncetest.Context(t)
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
	h, slow := slowAPI(t)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx := oncetest.Context(t)
	req := payment(srv.URL, "tok_slow")
	req.Key = client.NewKey()

	var first *client.Response
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { first, firstErr = fastClient().Do(ctx, req) })
	select {
	case <-slow:
	case <-ctx.Done():
		t.Fatal("the slow payment never started")
	}
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
	ctx := oncetest.Context(t)
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
	res, err := c.Do(oncetest.Context(t), payment(srv.URL, "tok_gatewayError"))
	notFinal, ok := errors.AsType[*client.NotFinalError](err)
	require.True(t, ok, "a 502 is no final answer: %v", err)
	require.Same(t, res, notFinal.Response)
	require.Equal(t, http.StatusBadGateway, res.StatusCode)
	require.Equal(t, 3, res.Attempts, "a 5xx answer is retried up to the limit")
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
	res, err := fastClient().Do(oncetest.Context(t), payment(srv.URL, "tok_visa"))
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
