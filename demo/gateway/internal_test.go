package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// These tests stay inside the package and use no database: demo/demotest
// imports this package, so only the external tests (package gateway_test)
// may use it.

func TestParseFaults(t *testing.T) {
	t.Parallel()
	good := map[string]Faults{
		"":    {},
		"   ": {},
		"charge_then_500=0.1,charge_then_hang=0.05,charge_then_reset=0.05,fail_before_charge=0.05": {
			ChargeThen500: 0.1, ChargeThenHang: 0.05, ChargeThenReset: 0.05, FailBeforeCharge: 0.05},
		" charge_then_reset = 1 ":                   {ChargeThenReset: 1},
		"fail_before_charge=0,charge_then_500=0.25": {ChargeThen500: 0.25},
		"charge_then_500=0.5,fail_before_charge=.5": {ChargeThen500: 0.5, FailBeforeCharge: 0.5},
	}
	for in, want := range good {
		got, err := ParseFaults(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		again, err := ParseFaults(got.String())
		require.NoError(t, err)
		require.Equal(t, got, again, "String round-trips")
	}
	bad := map[string]string{
		"charge_then_500":                          "want mode=probability",
		"=0.1":                                     "want mode=probability",
		"charge_then_501=0.1":                      "unknown fault mode",
		"charge_then_500=x":                        "from 0 to 1",
		"charge_then_500=1.5":                      "from 0 to 1",
		"charge_then_500=-0.1":                     "from 0 to 1",
		"charge_then_500=NaN":                      "from 0 to 1",
		"charge_then_500=0.1,charge_then_500=0.2":  "given twice",
		"charge_then_500=0.7,charge_then_hang=0.4": "more than 1",
		"charge_then_500=0.1,":                     "want mode=probability",
	}
	for in, want := range bad {
		_, err := ParseFaults(in)
		require.ErrorContains(t, err, want, in)
		require.NotContains(t, err.Error(), "\n")
	}
}

func TestFaultsPick(t *testing.T) {
	t.Parallel()
	f := Faults{FailBeforeCharge: 0.1, ChargeThen500: 0.2, ChargeThenHang: 0.3, ChargeThenReset: 0.4}
	for r, want := range map[float64]string{
		0: FaultFailBeforeCharge, 0.099: FaultFailBeforeCharge, 0.1: FaultChargeThen500, 0.29: FaultChargeThen500,
		0.31: FaultChargeThenHang, 0.59: FaultChargeThenHang, 0.61: FaultChargeThenReset, 0.9999999: FaultChargeThenReset,
	} {
		require.Equal(t, want, f.pick(r), r)
	}
	require.Empty(t, Faults{}.pick(0))
	require.Empty(t, Faults{ChargeThen500: 0.5}.pick(0.5))
	require.Equal(t, FaultChargeThenReset, Faults{ChargeThenReset: 1}.pick(0.99999))
	require.Equal(t, FaultChargeThenReset, Faults{ChargeThen500: 0.1, ChargeThenHang: 0.2, ChargeThenReset: 0.7}.pick(0.9999999999999999))
}
