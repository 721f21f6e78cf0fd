package tracing_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceonly/onceonly/cmd/internal/tracing"
)

// TestHandlerNamesSpansByRoute: a request's span is named after its route,
// never its raw path; a request no route took is named by its method.
func TestHandlerNamesSpansByRoute(t *testing.T) {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux.HandleFunc("/healthz", func(http.ResponseWriter, *http.Request) {})
	h := tracing.Handler(mux, "api", otelhttp.WithTracerProvider(tp))

	for _, tc := range []struct{ method, path, span string }{
		{http.MethodPost, "/v1/payments/pay_123", "POST /v1/payments/{id}"},
		{http.MethodGet, "/healthz", "GET /healthz"},
		{http.MethodGet, "/secret/pay_123", "GET"},
	} {
		recorder.Reset()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), tc.method, tc.path, nil))
		spans := recorder.Ended()
		require.Len(t, spans, 1, tc.path)
		require.Equal(t, tc.span, spans[0].Name(), tc.path)
	}
}

// TestStart: off without an endpoint (stop is a no-op); a refused setting
// is an error, with a stop still safe to call.
func TestStart(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	stop, err := tracing.Start(t.Context(), "x")
	require.NoError(t, err)
	stop()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	stop, err = tracing.Start(t.Context(), "x")
	require.ErrorContains(t, err, "http/protobuf")
	stop()
}
