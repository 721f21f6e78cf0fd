package onceonly

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the engine's spans.
const TracerName = "github.com/onceonly/onceonly"

// Span names and attributes. An execution is one span, onceonly.execute,
// with a child per phase: onceonly.check (Redis), onceonly.claim
// (Postgres), onceonly.handler, onceonly.step (one per Step that calls
// out), onceonly.complete (the completion and its commit). The outcome — the
// label of onceonly_requests_total — is an attribute of onceonly.execute.
const (
	spanExecute  = "onceonly.execute"
	spanCheck    = "onceonly.check"
	spanClaim    = "onceonly.claim"
	spanHandler  = "onceonly.handler"
	spanStep     = "onceonly.step"
	spanComplete = "onceonly.complete"

	attrScope    = attribute.Key("onceonly.scope")
	attrHandler  = attribute.Key("onceonly.handler")
	attrOutcome  = attribute.Key("onceonly.outcome")
	attrVersion  = attribute.Key("onceonly.version")
	attrStep     = attribute.Key("onceonly.step")
	attrClaimed  = attribute.Key("onceonly.claimed")
	attrVerdict  = attribute.Key("onceonly.cache.verdict")
	attrResumed  = attribute.Key("onceonly.resumed")
	attrReplayed = attribute.Key("onceonly.replayed")
	attrInTx     = attribute.Key("onceonly.caller_tx")
)

// offProvider is the global provider as it is before any SDK is installed:
// its spans record nothing, so while it is the global one the engine starts
// none and tracing costs an atomic load per phase.
var offProvider = otel.GetTracerProvider()

// noSpan is the span of a phase while tracing is off.
var noSpan = trace.SpanFromContext(context.Background())

// tracerOf is a provider's tracer, cached for the provider it came from.
type tracerOf struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
}

// startSpan starts the span of a phase: on Config.TracerProvider, else on
// the global provider, unless that traces nothing.
func (e *Engine) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	tp := e.cfg.TracerProvider
	if tp == nil {
		if tp = otel.GetTracerProvider(); tp == offProvider {
			return ctx, noSpan
		}
	}
	t := e.tracer.Load()
	if t == nil || t.provider != tp {
		t = &tracerOf{provider: tp, tracer: tp.Tracer(TracerName)}
		e.tracer.Store(t)
	}
	return t.tracer.Start(ctx, name) //nolint:spancheck // the caller ends it (endSpan, tracedOutcome)
}

// endSpan ends span, recording err (a nil err leaves the status unset).
func endSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// tracedOutcome records the outcome of an execution on its span and ends
// it. Answers that are not failures of the engine (a replay, a conflict, a
// reused key, bad input) leave the status unset.
func tracedOutcome(span trace.Span, outcome string, replayed bool, err error) {
	if span.IsRecording() {
		if outcome != outcomeAskedAgain {
			span.SetAttributes(attrOutcome.String(outcome), attrReplayed.Bool(replayed))
		}
		switch outcome {
		case outcomeUnavailable, outcomeHandlerError, outcomeLeaseLost, outcomePanic:
		default:
			err = nil
		}
	}
	endSpan(span, err)
}

// entryCall is one call of an entry point (execute, DoTx): when it began and
// its span.
type entryCall struct {
	start time.Time
	span  trace.Span
}

// enter opens a call of an entry point: its span (onceonly.execute) and its
// clock; the error says the key or the scope is not valid.
func (e *Engine) enter(ctx context.Context, scope, key, handler string, inTx bool) (context.Context, entryCall, error) {
	c := entryCall{start: time.Now()}
	ctx, c.span = e.startSpan(ctx, spanExecute)
	if c.span.IsRecording() {
		c.span.SetAttributes(attrScope.String(scope), attrHandler.String(handler), attrInTx.Bool(inTx))
	}
	if err := ValidateKey(key); err != nil {
		return ctx, c, err
	}
	return ctx, c, ValidateScope(scope)
}

// leave ends a call: its outcome counted and recorded on its span.
func (e *Engine) leave(c entryCall, outcome string, replayed bool, err error) {
	e.metrics.observe(outcome, c.start)
	tracedOutcome(c.span, outcome, replayed, err)
}
