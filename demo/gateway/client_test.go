package gateway_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

// TestClientClassifiesMisbehaviour covers answers the real gateway never
// gives (a body that does not decode, a 2xx it does not send): a peer that
// misbehaves leaves the outcome unknown. The real gateway's answers are
// classified in the other tests.
func TestClientClassifiesMisbehaviour(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		status int
		header map[string]string
		body   string
		check  func(t *testing.T, ch gateway.Charge, err error)
	}{
		{"201 that does not decode", 201, nil, `{"id":`, func(t *testing.T, _ gateway.Charge, err error) {
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
		{"201 without an id", 201, nil, `{"status":"succeeded"}`, func(t *testing.T, _ gateway.Charge, err error) {
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
		{"402 that says succeeded", 402, nil, `{"id":"ch_1","status":"succeeded"}`, func(t *testing.T, _ gateway.Charge, err error) {
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
		{"200", 200, nil, `{}`, func(t *testing.T, _ gateway.Charge, err error) {
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
		{"502 from a proxy", 502, nil, `<html>bad gateway</html>`, func(t *testing.T, _ gateway.Charge, err error) {
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
			require.ErrorContains(t, err, "502")
		}},
		{"409 with Retry-After 3", 409, map[string]string{"Retry-After": "3"}, `{}`, func(t *testing.T, _ gateway.Charge, err error) {
			var inFlight *gateway.InFlightError
			require.ErrorAs(t, err, &inFlight)
			require.Equal(t, 3*time.Second, inFlight.RetryAfter)
			require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
		{"409 without Retry-After", 409, nil, ``, func(t *testing.T, _ gateway.Charge, err error) {
			var inFlight *gateway.InFlightError
			require.ErrorAs(t, err, &inFlight)
			require.Equal(t, time.Second, inFlight.RetryAfter)
		}},
		{"404", 404, nil, `not found`, func(t *testing.T, _ gateway.Charge, err error) {
			require.Error(t, err)
			require.NotErrorIs(t, err, gateway.ErrUnknownOutcome)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c := &gateway.Client{BaseURL: srv.URL + "/"}
			ch, err := c.Charge(oncetest.Context(t), "k", visa("k"))
			tc.check(t, ch, err)
		})
	}
}

func TestClientUnreachableGateway(t *testing.T) {
	t.Parallel()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c := &gateway.Client{BaseURL: "http://" + addr}
	_, err = c.Charge(oncetest.Context(t), "k", visa("k"))
	require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
	_, err = c.Lookup(oncetest.Context(t), "acct/k")
	require.Error(t, err)
}
