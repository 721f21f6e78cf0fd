package oncekafka

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/consume"
)

// The reason label of onceonly_kafka_records_total, besides the
// dead-letter reasons of onceonly (reused, invalid, failed) and the
// reasons consume.Reason names (executed, replayed, in_flight, failed,
// handed_off, error), this.
const reasonDeadLetterFailed = "dead_letter_failed" // retry: the copy was not produced

// The op label of onceonly_kafka_errors_total.
const (
	opPoll       = "poll"
	opCommit     = "commit"
	opDeadLetter = "dead_letter"
)

type metrics struct {
	records  *prometheus.CounterVec
	duration prometheus.ObserverVec
	inFlight prometheus.Gauge
	paused   prometheus.Gauge
	errors   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, group string) (*metrics, error) {
	labels := []string{"group"}
	records := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_kafka_records_total",
		Help: "Records handled, by group, disposition (ack, retry, dead_letter) and reason: executed or replayed (ack); in_flight, failed, handed_off, error or dead_letter_failed (retry); reused, invalid or failed (dead_letter).",
	}, append(labels, "disposition", "reason"))
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "onceonly_kafka_record_duration_seconds",
		Help:    "Time from a record's start on a worker to its settlement, by group and disposition.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, append(labels, "disposition"))
	inFlight := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_kafka_records_in_flight",
		Help: "Records being handled now, by group.",
	}, labels)
	paused := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_kafka_partitions_paused",
		Help: "Partitions paused because their window of unsettled records is full, by group.",
	}, labels)
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_kafka_errors_total",
		Help: "Calls to Kafka that failed, by group and op (poll, commit, dead_letter).",
	}, append(labels, "op"))
	var err error
	if records, err = consume.SharedCollector(reg, records); err != nil {
		return nil, err
	}
	if duration, err = consume.SharedCollector(reg, duration); err != nil {
		return nil, err
	}
	if inFlight, err = consume.SharedCollector(reg, inFlight); err != nil {
		return nil, err
	}
	if paused, err = consume.SharedCollector(reg, paused); err != nil {
		return nil, err
	}
	if errs, err = consume.SharedCollector(reg, errs); err != nil {
		return nil, err
	}
	l := prometheus.Labels{"group": group}
	return &metrics{
		records:  records.MustCurryWith(l),
		duration: duration.MustCurryWith(l),
		inFlight: inFlight.With(l),
		paused:   paused.With(l),
		errors:   errs.MustCurryWith(l),
	}, nil
}
