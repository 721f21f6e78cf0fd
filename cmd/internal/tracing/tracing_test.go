package tracing_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/testotlp"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/oncetest"
)

// TestSetupExportsOverOTLPHTTP: with OTEL_EXPORTER_OTLP_ENDPOINT set, the
// engine's spans (through the global provider, as in the daemons) reach an
// OTLP/HTTP endpoint under the service name, OTEL_SERVICE_NAME winning.
func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	col := testotlp.NewOTLPCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_SERVICE_NAME", "payments-api")
	ctx := oncetest.Context(t)
	shutdown, err := tracing.Setup(ctx, "onceonly-api")
	require.NoError(t, err)

	e, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t), Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	_, err = e.Do(ctx, "s", "k", nil, func(context.Context, pgx.Tx) (onceonly.Result, error) { return onceonly.Result{Status: 201}, nil })
	require.NoError(t, err)
	require.NoError(t, shutdown(ctx)) // flushes

	require.NotEmpty(t, col.Find("payments-api", "onceonly.execute"))
	require.NotEmpty(t, col.Find("payments-api", "onceonly.handler"))
}

// TestSetupIsOffByDefault: without an endpoint, or with the SDK disabled,
// nothing is installed; a protocol other than http/protobuf is an error.
func TestSetupIsOffByDefault(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": ""},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
	} {
		for k, v := range env {
			t.Setenv(k, v)
		}
		before := otel.GetTracerProvider()
		shutdown, err := tracing.Setup(t.Context(), "x")
		require.NoError(t, err)
		require.NoError(t, shutdown(t.Context()))
		require.Equal(t, before, otel.GetTracerProvider(), "nothing installed for %v", env)
		for k := range env {
			t.Setenv(k, "")
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	_, err := tracing.Setup(t.Context(), "x")
	require.ErrorContains(t, err, "http/protobuf")
}
