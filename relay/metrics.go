package relay

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/internal/promutil"
)

// Stages of onceonly_relay_errors_total.
const (
	stagePostgres = "postgres"
	stageRedis    = "redis"
	stageListen   = "listen"
	stageEvent    = "event"
	stageCount    = "count"
	stageReplicas = "replicas"
)

type metrics struct {
	published     prometheus.Counter
	parked        prometheus.Counter
	batchSize     prometheus.Histogram
	lag           prometheus.Histogram
	errors        *prometheus.CounterVec
	pendingEvents prometheus.Gauge
	parkedEvents  prometheus.Gauge
	oldestPending prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_relay_events_published_total",
			Help: "Outbox events applied to Redis and deleted from Postgres.",
		}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_relay_events_parked_total",
			Help: "Outbox events parked after failing every attempt (see outbox.last_error).",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceonly_relay_batch_size",
			Help:    "Events per delivered batch.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500},
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceonly_relay_lag_seconds",
			Help:    "Time from an event's write in Postgres to Redis acknowledging it.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_relay_errors_total",
			Help: "Relay failures by stage: postgres, redis, listen, event (one event could not be applied), count, replicas (a batch waited for Redis replicas in vain).",
		}, []string{"stage"}),
		pendingEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceonly_relay_pending_events",
			Help: "Outbox events waiting for delivery, as last counted.",
		}),
		parkedEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceonly_relay_parked_events",
			Help: "Parked outbox events, as last counted.",
		}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceonly_relay_oldest_pending_seconds",
			Help: "Age of the oldest outbox event waiting for delivery, as last counted (0 when none waits): it grows while no relay delivers.",
		}),
	}
	for _, stage := range []string{stagePostgres, stageRedis, stageListen, stageEvent, stageCount, stageReplicas} {
		m.errors.WithLabelValues(stage)
	}
	err := promutil.Register(reg, m.published, m.parked, m.batchSize, m.lag, m.errors, m.pendingEvents, m.parkedEvents, m.oldestPending)
	return m, err
}
