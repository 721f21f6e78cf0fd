// Package tracing installs OpenTelemetry tracing in a daemon from the
// standard OTEL_* environment variables, and traces its HTTP requests.
//
// Tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (or OTEL_TRACES_EXPORTER=otlp),
// and off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. Spans
// go out over OTLP/HTTP (protobuf); the exporter reads the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression,
// certificates), the SDK reads OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG, and the resource reads OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. W3C trace context and baggage are propagated.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Setup installs the global tracer provider the environment asks for, with
// service as the default service.name, and returns the function that
// flushes and stops it (a no-op when tracing is off). It reads the process
// environment, as the exporter and the SDK do.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if !enabled() {
		return off, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(name); v != "" && v != "http/protobuf" {
			return off, fmt.Errorf("tracing: %s=%s is not supported; use http/protobuf", name, v)
		}
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return off, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return off, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// flushTimeout bounds the flush of the spans still buffered at a stop.
const flushTimeout = 5 * time.Second

// Start is Setup for a command: it installs tracing for service and
// returns stop, which flushes the spans still buffered (within five
// seconds, even after ctx has ended) and stops the provider.
func Start(ctx context.Context, service string) (stop func(), err error) {
	shutdown, err := Setup(ctx, service)
	if err != nil {
		return func() {}, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
		defer cancel()
		_ = shutdown(sctx)
	}, nil
}

// Handler wraps a command's handler in a server span per request, joining
// the caller's trace (W3C traceparent); without tracing it costs a no-op
// span. A span is named after the route that served it ("POST
// /v1/payments"), never the raw path, which may hold identifiers. opts
// (a tracer provider, in tests) come after these.
func Handler(h http.Handler, operation string, opts ...otelhttp.Option) http.Handler {
	return otelhttp.NewHandler(h, operation, append([]otelhttp.Option{otelhttp.WithSpanNameFormatter(spanName)}, opts...)...)
}

// spanName names the span of request r by its route.
func spanName(_ string, r *http.Request) string {
	switch {
	case r.Pattern == "": // not routed yet: the method alone, never the raw path
		return r.Method
	case strings.Contains(r.Pattern, " "): // "POST /v1/payments"
		return r.Pattern
	}
	return r.Method + " " + r.Pattern
}

// enabled tells whether the environment asks for traces.
func enabled() bool {
	get := func(name string) string { return strings.TrimSpace(os.Getenv(name)) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(get("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}
