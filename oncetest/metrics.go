package oncetest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the sum of the counter and gauge values of the metric
// family name in reg, over its series whose labels have the values of want
// (a label want does not name matches any value; nil sums every series):
// 0 when no series matches.
func Metric(tb testing.TB, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	tb.Helper()
	families, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather the metrics: %v", err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
