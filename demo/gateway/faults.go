package gateway

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The fault modes, as GATEWAY_FAULTS and the gateway_faults_total metric
// name them.
const (
	// FaultChargeThen500 commits the charge, then answers 500.
	FaultChargeThen500 = "charge_then_500"
	// FaultChargeThenHang commits the charge, then holds the answer for
	// Config.Hang (or until the client goes away or the server shuts down).
	FaultChargeThenHang = "charge_then_hang"
	// FaultChargeThenReset commits the charge, then resets the TCP
	// connection without an answer.
	FaultChargeThenReset = "charge_then_reset"
	// FaultFailBeforeCharge answers 503 without charging.
	FaultFailBeforeCharge = "fail_before_charge"
)

// faultModes lists the modes in the order a roll of the dice tries them.
var faultModes = []string{FaultFailBeforeCharge, FaultChargeThen500, FaultChargeThenHang, FaultChargeThenReset}

// Faults are the probabilities, each in [0, 1] and together at most 1, with
// which a charge call suffers each injected fault (for chaos tests). The zero
// value injects none.
//
// A call rolls once: it suffers at most one fault. The charge_then_* modes
// apply to a call that ends in a final answer (201 or 402, a first charge or
// a replay), so the charge exists whenever one of them struck;
// fail_before_charge applies to every well-formed call but tok_gatewayError.
type Faults struct {
	ChargeThen500, ChargeThenHang, ChargeThenReset, FailBeforeCharge float64
}

// ParseFaults reads the GATEWAY_FAULTS form, comma-separated mode=probability
// pairs, e.g. "charge_then_500=0.1,fail_before_charge=0.05". The modes are
// charge_then_500, charge_then_hang, charge_then_reset and fail_before_charge;
// a mode left out has probability 0, and an empty string means no faults.
func ParseFaults(s string) (Faults, error) {
	var f Faults
	if strings.TrimSpace(s) == "" {
		return f, nil
	}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		name, raw, ok := strings.Cut(item, "=")
		name, raw = strings.TrimSpace(name), strings.TrimSpace(raw)
		if !ok || name == "" {
			return Faults{}, fmt.Errorf("%q: want mode=probability", item)
		}
		p := faultField(&f, name)
		if p == nil {
			return Faults{}, fmt.Errorf("%q: unknown fault mode (use %s)", name, strings.Join(faultModes, ", "))
		}
		if seen[name] {
			return Faults{}, fmt.Errorf("%q: mode given twice", name)
		}
		seen[name] = true
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
			return Faults{}, fmt.Errorf("%s=%q: the probability must be a number from 0 to 1", name, raw)
		}
		*p = v
	}
	if err := f.validate(); err != nil {
		return Faults{}, err
	}
	return f, nil
}

// String returns f in the GATEWAY_FAULTS form, modes with probability 0 left
// out ("" when no fault is injected).
func (f Faults) String() string {
	var parts []string
	for _, m := range faultModes {
		if p := *faultField(&f, m); p != 0 {
			parts = append(parts, m+"="+strconv.FormatFloat(p, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ",")
}

// faultField returns a pointer to f's probability of mode, nil for an
// unknown mode.
func faultField(f *Faults, mode string) *float64 {
	switch mode {
	case FaultChargeThen500:
		return &f.ChargeThen500
	case FaultChargeThenHang:
		return &f.ChargeThenHang
	case FaultChargeThenReset:
		return &f.ChargeThenReset
	case FaultFailBeforeCharge:
		return &f.FailBeforeCharge
	}
	return nil
}

func (f Faults) validate() error {
	sum := 0.0
	for _, m := range faultModes {
		p := *faultField(&f, m)
		if math.IsNaN(p) || p < 0 || p > 1 {
			return fmt.Errorf("%s=%v: the probability must be a number from 0 to 1", m, p)
		}
		sum += p
	}
	if sum > 1+1e-9 {
		return errors.New("the fault probabilities add up to more than 1")
	}
	return nil
}

// pick returns the mode a roll r in [0, 1) lands on, "" for none: each mode
// takes its share of [0, 1) in turn. Probabilities adding up to 1 (give or
// take rounding) always pick a mode.
func (f Faults) pick(r float64) string {
	acc := 0.0
	for _, m := range faultModes {
		p := *faultField(&f, m)
		if p == 0 {
			continue
		}
		acc += p
		if r < acc || acc >= 1-1e-9 {
			return m
		}
	}
	return ""
}
