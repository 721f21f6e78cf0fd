package onceonly

import (
	"context"
	"testing"
)

// BenchmarkSpansOff measures what the spans of one replay (execute and
// check) and of one first execution (execute, check, claim, handler,
// complete) cost with tracing off — the global provider without an SDK —
// to set beside BenchmarkTracing's whole requests:
//
//	go test -run '^$' -bench SpansOff -benchmem .
func BenchmarkSpansOff(b *testing.B) {
	e := &Engine{}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		children []string
	}{
		{"replay", []string{spanCheck}},
		{"first", []string{spanCheck, spanClaim, spanHandler, spanComplete}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				sctx, span := e.startSpan(ctx, spanExecute)
				if span.IsRecording() {
					span.SetAttributes(attrScope.String("s"), attrHandler.String("h"))
				}
				for _, name := range tc.children {
					_, child := e.startSpan(sctx, name)
					endSpan(child, nil)
				}
				tracedOutcome(span, outcomeExecuted, false, nil)
			}
		})
	}
}
