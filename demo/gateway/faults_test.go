package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/gateway"
	"github.com/onceonly/onceonly/oncetest"
)

func visa(key string) gateway.ChargeRequest {
	return gateway.ChargeRequest{Amount: 4200, Currency: "usd", Source: "tok_visa", Reference: "acct/" + key}
}

// TestFaults runs each fault mode with probability 1 on a handler, next to
// a handler without faults on the same database, which tells what was
// charged.
func TestFaults(t *testing.T) {
	t.Parallel()

	t.Run(gateway.FaultChargeThen500, func(t *testing.T) {
		t.Parallel()
		pool := migratedDB(t)
		g := serve(t, pool, gateway.Config{Faults: gateway.Faults{ChargeThen500: 1}})
		clean := serve(t, pool, gateway.Config{})
		ctx := oncetest.Context(t)

		a := post(t, g.URL, "f500", chargeBody(4200, "tok_visa", "acct/f500"))
		require.Equal(t, http.StatusInternalServerError, a.Code, a.Body)
		require.Equal(t, "succeeded", readRow(t, pool, "f500").Status, "charged before the 500")
		_, err := g.Client.Charge(ctx, "f500-client", visa("f500-client"))
		require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		require.Equal(t, "succeeded", readRow(t, pool, "f500-client").Status)

		ch, err := clean.Client.Charge(ctx, "f500", visa("f500"))
		require.NoError(t, err, "a later call with the key tells")
		require.Equal(t, readRow(t, pool, "f500").ChargeID, ch.ID)

		// Faults strike final answers only: a reused key is still 422.
		reused := post(t, g.URL, "f500", chargeBody(1, "tok_visa", "acct/f500"))
		require.Equal(t, http.StatusUnprocessableEntity, reused.Code)

		require.EqualValues(t, 2, counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultChargeThen500}))
		require.EqualValues(t, 2, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
		require.Equal(t, 2, countRows(t, pool))
	})

	t.Run(gateway.FaultChargeThenHang, func(t *testing.T) {
		t.Parallel()
		pool := migratedDB(t)
		const hang = 400 * time.Millisecond
		g := serve(t, pool, gateway.Config{Faults: gateway.Faults{ChargeThenHang: 1}, Hang: hang})
		clean := serve(t, pool, gateway.Config{})
		ctx := oncetest.Context(t)

		impatient := &gateway.Client{BaseURL: g.URL, HTTP: &http.Client{Timeout: 100 * time.Millisecond}}
		_, err := impatient.Charge(ctx, "hang", visa("hang"))
		require.ErrorIs(t, err, gateway.ErrUnknownOutcome, "a timeout")
		require.Equal(t, "succeeded", readRow(t, pool, "hang").Status)
		ch, err := clean.Client.Charge(ctx, "hang", visa("hang"))
		require.NoError(t, err)
		require.Equal(t, readRow(t, pool, "hang").ChargeID, ch.ID)

		began := time.Now()
		a := post(t, g.URL, "hang-patient", chargeBody(4200, "tok_visa", "acct/hang-patient"))
		require.Equal(t, http.StatusCreated, a.Code, "after the hang, the answer")
		require.GreaterOrEqual(t, time.Since(began), hang)

		// A long hang ends as soon as the client goes away.
		long := serve(t, pool, gateway.Config{Faults: gateway.Faults{ChargeThenHang: 1}, Hang: time.Hour})
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = long.Client.Charge(cctx, "hang-long", visa("hang-long"))
		require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		oncetest.Eventually(t, 5*time.Second, "the hanging call ended", func() bool {
			return counter(t, long.Reg, "gateway_requests_total", map[string]string{"code": "none"}) == 1
		})
		require.Equal(t, "succeeded", readRow(t, pool, "hang-long").Status)
		require.EqualValues(t, 2, counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultChargeThenHang}))
	})

	t.Run(gateway.FaultChargeThenReset, func(t *testing.T) {
		t.Parallel()
		pool := migratedDB(t)
		g := serve(t, pool, gateway.Config{Faults: gateway.Faults{ChargeThenReset: 1}})
		clean := serve(t, pool, gateway.Config{})
		ctx := oncetest.Context(t)

		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/charges", strings.NewReader(chargeBody(4200, "tok_visa", "acct/reset")))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "reset")
		res, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err == nil {
			res.Body.Close()
		}
		require.Error(t, err, "no answer, the connection is reset")
		require.Equal(t, "succeeded", readRow(t, pool, "reset").Status)

		_, err = g.Client.Charge(ctx, "reset-client", visa("reset-client"))
		require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		require.Equal(t, "succeeded", readRow(t, pool, "reset-client").Status)
		ch, err := clean.Client.Charge(ctx, "reset-client", visa("reset-client"))
		require.NoError(t, err)
		require.Equal(t, readRow(t, pool, "reset-client").ChargeID, ch.ID)

		require.GreaterOrEqual(t, counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultChargeThenReset}), 2.0)
		require.GreaterOrEqual(t, counter(t, g.Reg, "gateway_requests_total", map[string]string{"code": "none"}), 2.0)
		require.EqualValues(t, 2, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
	})

	t.Run(gateway.FaultFailBeforeCharge, func(t *testing.T) {
		t.Parallel()
		pool := migratedDB(t)
		g := serve(t, pool, gateway.Config{Faults: gateway.Faults{FailBeforeCharge: 1}})
		clean := serve(t, pool, gateway.Config{})
		ctx := oncetest.Context(t)

		a := post(t, g.URL, "fail", chargeBody(4200, "tok_visa", "acct/fail"))
		require.Equal(t, http.StatusServiceUnavailable, a.Code)
		require.Equal(t, "1", a.Header.Get("Retry-After"))
		_, err := g.Client.Charge(ctx, "fail", visa("fail"))
		require.ErrorIs(t, err, gateway.ErrUnknownOutcome)
		require.Zero(t, countRows(t, pool), "nothing charged")
		list, err := g.Client.Lookup(ctx, "acct/fail")
		require.NoError(t, err, "the look-up is not a charge call")
		require.Empty(t, list.Data)

		ch, err := clean.Client.Charge(ctx, "fail", visa("fail"))
		require.NoError(t, err)
		require.Equal(t, "succeeded", ch.Status)
		require.EqualValues(t, 2, counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultFailBeforeCharge}))
		require.Zero(t, counter(t, g.Reg, "gateway_charges_total", map[string]string{"status": "succeeded"}))
	})

	t.Run("mixed", func(t *testing.T) {
		t.Parallel()
		pool := migratedDB(t)
		faults, err := gateway.ParseFaults("charge_then_500=0.5,fail_before_charge=0.5")
		require.NoError(t, err)
		g := serve(t, pool, gateway.Config{Faults: faults})
		for i := range 40 {
			key := "mixed-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			a := post(t, g.URL, key, chargeBody(1, "tok_visa", "acct/"+key))
			require.Contains(t, []int{500, 503}, a.Code)
			require.Equal(t, a.Code == 500, readRow(t, pool, key).Found, "charged exactly when the fault came after the charge")
		}
		f500 := counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultChargeThen500})
		f503 := counter(t, g.Reg, "gateway_faults_total", map[string]string{"mode": gateway.FaultFailBeforeCharge})
		require.EqualValues(t, 40, f500+f503)
		require.EqualValues(t, countRows(t, pool), f500)
	})
}
