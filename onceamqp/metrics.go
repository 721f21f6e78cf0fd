package onceamqp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/consume"
)

// metrics are a consumer's Prometheus metrics, labeled with its queue.
type metrics struct {
	// deliveries: disposition (ack, retry, dead_letter) and reason.
	deliveries   *prometheus.CounterVec
	settleErrors prometheus.Counter
	// connects: result (ok, error).
	connects  *prometheus.CounterVec
	connected prometheus.Gauge
	held      prometheus.Gauge
}

const labelQueue = "queue"

func newMetrics(reg prometheus.Registerer, queue string) (*metrics, error) {
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_amqp_deliveries_total",
		Help: "Deliveries settled, by queue, disposition (ack, retry, dead_letter) and reason: executed or replayed (ack); in_flight, failed, handed_off or error (retry); reused, invalid or failed (dead_letter).",
	}, []string{labelQueue, "disposition", "reason"})
	settleErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_amqp_settle_errors_total",
		Help: "Acks, requeues and rejects that did not reach the broker (their channel was gone; the broker redelivers those messages), by queue.",
	}, []string{labelQueue})
	connects := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_amqp_connects_total",
		Help: "Attempts to connect and consume, by queue and result (ok, error).",
	}, []string{labelQueue, "result"})
	connected := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_amqp_connected",
		Help: "1 while the consumer of the queue consumes on a live connection.",
	}, []string{labelQueue})
	held := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_amqp_held_deliveries",
		Help: "Deliveries held for a later requeue (a key in flight, a failed or handed-off execution), by queue; each holds a prefetch slot.",
	}, []string{labelQueue})
	var err error
	if deliveries, err = consume.SharedCollector(reg, deliveries); err != nil {
		return nil, err
	}
	if settleErrors, err = consume.SharedCollector(reg, settleErrors); err != nil {
		return nil, err
	}
	if connects, err = consume.SharedCollector(reg, connects); err != nil {
		return nil, err
	}
	if connected, err = consume.SharedCollector(reg, connected); err != nil {
		return nil, err
	}
	if held, err = consume.SharedCollector(reg, held); err != nil {
		return nil, err
	}
	q := prometheus.Labels{labelQueue: queue}
	return &metrics{
		deliveries:   deliveries.MustCurryWith(q),
		settleErrors: settleErrors.With(q),
		connects:     connects.MustCurryWith(q),
		connected:    connected.With(q),
		held:         held.With(q),
	}, nil
}
