package reconcile

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracer traces the reconciler's passes (onceonly.reconcile.pass) on the
// global provider, which records nothing until an SDK is installed.
var tracer = otel.Tracer("github.com/onceonly/onceonly/reconcile")

// tracePass records a pass's report (and error) on its span.
func tracePass(span trace.Span, rep *Report, err error) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.Bool("onceonly.reconcile.skipped", rep.Skipped),
			attribute.Bool("onceonly.reconcile.dry_run", rep.DryRun),
			attribute.Int64("onceonly.reconcile.drift", rep.Drift()),
			attribute.Int64("onceonly.reconcile.repaired", rep.Repaired),
			attribute.Int64("onceonly.reconcile.leases_reaped", rep.LeasesReaped),
			attribute.Int64("onceonly.reconcile.expired_deleted", rep.ExpiredDeleted),
			attribute.Int64("onceonly.reconcile.unreachable", rep.Unreachable),
		)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
}
