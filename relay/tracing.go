package relay

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// tracer traces the relay's batches (onceonly.relay.batch) on the global
// provider, which records nothing until an SDK is installed.
var tracer = otel.Tracer("github.com/onceonly/onceonly/relay")

// noSpan stands for the span of a batch that took no event.
var noSpan = trace.SpanFromContext(context.Background())

// endBatchSpan records what a batch did on its span and ends it.
func endBatchSpan(span trace.Span, res batchResult) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.Int("onceonly.relay.taken", res.taken),
			attribute.Int("onceonly.relay.published", res.published),
			attribute.Int("onceonly.relay.failed", res.failed),
			attribute.Int("onceonly.relay.parked", res.parked),
		)
	}
	span.End()
}
