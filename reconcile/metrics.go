package reconcile

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/internal/promutil"
)

// Results of onceonly_reconcile_passes_total.
const (
	resultOK      = "ok"
	resultSkipped = "skipped"
	resultFailed  = "failed"
	resultPartial = "partial"
)

type metrics struct {
	passes       *prometheus.CounterVec
	duration     prometheus.Histogram
	drift        *prometheus.CounterVec
	repaired     prometheus.Counter
	repairErrors prometheus.Counter
	reaped       prometheus.Counter
	expired      prometheus.Counter
	lastSuccess  prometheus.Gauge
	stuck        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_reconcile_passes_total",
			Help: "Reconcile passes by result: ok, partial (Redis could not serve part of the keyspace), skipped (another instance held the lock), failed.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceonly_reconcile_pass_duration_seconds",
			Help:    "Duration of finished reconcile passes.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_reconcile_drift_total",
			Help: "Keys found out of step between Postgres and Redis, by kind.",
		}, []string{"kind"}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_reconcile_repaired_total",
			Help: "Drifted Redis keys written or deleted.",
		}),
		repairErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_reconcile_repair_errors_total",
			Help: "Repairs Redis refused.",
		}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_reconcile_leases_reaped_total",
			Help: "In-progress keys past their lease marked failed.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_reconcile_expired_deleted_total",
			Help: "Expired keys deleted from Postgres.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceonly_reconcile_last_success_timestamp_seconds",
			Help: "When the last successful repairing pass ended (Unix time).",
		}),
		stuck: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceonly_reconcile_stuck_executions",
			Help: "Keys in progress with a step started whose lease ran out more than REAP_GRACE ago, as the last pass counted: executions no live engine has resumed.",
		}),
	}
	for _, kind := range driftKinds {
		m.drift.WithLabelValues(kind)
	}
	for _, res := range []string{resultOK, resultPartial, resultSkipped, resultFailed} {
		m.passes.WithLabelValues(res)
	}
	err := promutil.Register(reg, m.passes, m.duration, m.drift, m.repaired, m.repairErrors, m.reaped, m.expired, m.lastSuccess, m.stuck)
	return m, err
}
