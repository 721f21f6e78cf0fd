package onceonly_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// TestTracing: an execution is one onceonly.execute span with its outcome,
// and a child per phase — check, claim, handler, the step inside the
// handler, complete; a replay is one execute span with the replay outcome.
func TestTracing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e, err := onceonly.New(onceonly.Config{Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, TracerProvider: tp, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	require.NoError(t, e.Register("charge", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		id, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (string, error) { return "ch_1", nil })
		return onceonly.Result{Status: 201, Body: []byte(`{"charge":"` + id + `"}`)}, err
	}))

	_, err = e.Run(b.ctx, "charge", "m", "traced", []byte(`{}`))
	require.NoError(t, err)
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range recorder.Ended() {
		spans[s.Name()] = s
	}
	require.Len(t, spans, 6, "spans: %v", names(recorder.Ended()))
	root := spans["onceonly.execute"]
	require.Equal(t, "executed", attr(root, "onceonly.outcome").AsString())
	require.Equal(t, "charge", attr(root, "onceonly.handler").AsString())
	require.Equal(t, "m", attr(root, "onceonly.scope").AsString())
	require.True(t, attr(spans["onceonly.claim"], "onceonly.claimed").AsBool())
	require.Equal(t, "claimed", attr(spans["onceonly.check"], "onceonly.cache.verdict").AsString())
	require.Equal(t, "gateway", attr(spans["onceonly.step"], "onceonly.step").AsString())
	// The execution began as one commit: its first step committed the claim.
	require.Equal(t, spans["onceonly.step"].SpanContext().SpanID(), spans["onceonly.claim"].Parent().SpanID(), "the claim is the first step's")
	for _, child := range []string{"onceonly.check", "onceonly.handler", "onceonly.complete"} {
		require.Equal(t, root.SpanContext().SpanID(), spans[child].Parent().SpanID(), child+" is a child of the execution")
	}
	require.Equal(t, spans["onceonly.handler"].SpanContext().SpanID(), spans["onceonly.step"].Parent().SpanID(), "the step runs inside the handler")

	before := len(recorder.Ended())
	replay, err := e.Run(b.ctx, "charge", "m", "traced", []byte(`{}`))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Eventually(t, func() bool { return len(recorder.Ended()) > before }, time.Second, time.Millisecond)
	var last sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended()[before:] {
		if s.Name() == "onceonly.execute" {
			last = s
		}
	}
	require.NotNil(t, last)
	require.Equal(t, "replayed_cache", attr(last, "onceonly.outcome").AsString())
	require.True(t, attr(last, "onceonly.replayed").AsBool())
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// BenchmarkTracing measures replays and first executions with tracing off
// (the global provider without an SDK: what every user without
// OpenTelemetry runs), with an SDK that samples nothing, and with an SDK
// that records every span, side by side:
//
//	go test -run '^$' -bench Tracing -benchtime 3000x .
func BenchmarkTracing(b *testing.B) {
	ctx := oncetest.Context(b)
	pool := oncetest.DB(b)
	rdb, prefix := oncetest.Redis(b)
	providers := []struct {
		name string
		tp   *sdktrace.TracerProvider // nil: tracing off
	}{
		{"off", nil},
		{"sdk-never-sample", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		{"sdk-record-all", sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))},
	}
	ok := func(_ context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		return onceonly.Result{Status: 201, Body: []byte(`{"id":"` + x.Key() + `"}`)}, nil
	}
	for _, p := range providers {
		cfg := onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, Logger: oncetest.QuietLogger()}
		if p.tp != nil {
			cfg.TracerProvider = p.tp
			b.Cleanup(func() { _ = p.tp.Shutdown(context.Background()) })
		}
		e, err := onceonly.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(e.Close)
		if err := e.Register("ok", ok); err != nil {
			b.Fatal(err)
		}
		if _, err := e.Run(ctx, "ok", "bench", "replayed-"+p.name, nil); err != nil {
			b.Fatal(err)
		}
		b.Run("replay/"+p.name, func(b *testing.B) {
			for range b.N {
				if out, err := e.Run(ctx, "ok", "bench", "replayed-"+p.name, nil); err != nil || !out.Replayed {
					b.Fatal(out, err)
				}
			}
		})
		b.Run("first/"+p.name, func(b *testing.B) {
			run := oncetest.RandomSuffix(8)
			for i := range b.N {
				if _, err := e.Run(ctx, "ok", "bench", run+"-"+strconv.Itoa(i), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
