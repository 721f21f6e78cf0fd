package oncetest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Variant is one way a benchmark drains a backlog of messages: bare, or
// through one of the project's consumers.
type Variant struct {
	// Name names the variant in the metrics (msgs/s_<Name>).
	Name string
	// Drain drains round's backlog (it may publish it first, with the
	// timer stopped) and returns how long draining took.
	Drain func(b *testing.B, round int) time.Duration
}

// CompareRates runs b.N rounds, each draining a backlog (of the given
// number of messages) once per variant, in rotating order so that all see the same
// machine, and reports each variant's rate (msgs/s_<name>) and, past the
// first, its ratio to the first's (<name>/<first name>). The timer runs
// only where a Drain starts it.
func CompareRates(b *testing.B, messages int, variants ...Variant) {
	b.Helper()
	took := make([]time.Duration, len(variants))
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		for j := range variants {
			v := (i + j) % len(variants)
			took[v] += variants[v].Drain(b, i)
		}
	}
	rate := func(v int) float64 { return float64(messages*b.N) / took[v].Seconds() }
	summary := []string{fmt.Sprintf("%s %.0f msgs/s", variants[0].Name, rate(0))}
	b.ReportMetric(rate(0), "msgs/s_"+variants[0].Name)
	for v := 1; v < len(variants); v++ {
		name := variants[v].Name
		b.ReportMetric(rate(v), "msgs/s_"+name)
		b.ReportMetric(rate(v)/rate(0), name+"/"+variants[0].Name)
		summary = append(summary, fmt.Sprintf("%s %.0f msgs/s (%.2f× %s)", name, rate(v), rate(v)/rate(0), variants[0].Name))
	}
	b.Logf("%d messages per round, %d rounds: %s", messages, b.N, strings.Join(summary, ", "))
}
