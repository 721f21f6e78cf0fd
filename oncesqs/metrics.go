package oncesqs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/consume"
)

// The reason label of onceonly_sqs_messages_total, besides the
// dead-letter reasons of onceonly (reused, invalid, failed) and the
// reasons consume.Reason names (executed, replayed, in_flight, failed,
// handed_off, error), these.
const (
	reasonDeadLetterFailed = "dead_letter_failed" // retry: the copy was not sent
	reasonShutdown         = "shutdown"           // retry: handed back unstarted
)

// The op label of onceonly_sqs_settle_errors_total.
const (
	opDelete     = "delete"
	opVisibility = "visibility"
	opHeartbeat  = "heartbeat"
	opDeadLetter = "dead_letter"
	opReceive    = "receive"
	opAttributes = "attributes"
)

type metrics struct {
	messages     *prometheus.CounterVec
	duration     prometheus.ObserverVec
	inFlight     prometheus.Gauge
	settleErrors *prometheus.CounterVec
	deleteBatch  prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, queue string) (*metrics, error) {
	labels := []string{"queue"}
	messages := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_sqs_messages_total",
		Help: "Messages settled, by queue, disposition (ack, retry, dead_letter) and reason: executed or replayed (ack); in_flight, failed, handed_off, error, dead_letter_failed or shutdown (retry); reused, invalid or failed (dead_letter).",
	}, append(labels, "disposition", "reason"))
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "onceonly_sqs_message_duration_seconds",
		Help:    "Time from a message's arrival at a worker to its settlement, by queue and disposition.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, append(labels, "disposition"))
	inFlight := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_sqs_messages_in_flight",
		Help: "Messages being handled now, by queue.",
	}, labels)
	settleErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_sqs_settle_errors_total",
		Help: "Calls to SQS that failed, by queue and op (delete, visibility, heartbeat, dead_letter, receive, attributes); an unsettled message comes back after its visibility timeout.",
	}, append(labels, "op"))
	deleteBatch := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "onceonly_sqs_delete_batch_size",
		Help:    "Messages per DeleteMessageBatch call, by queue.",
		Buckets: []float64{1, 2, 3, 5, 8, 10},
	}, labels)
	var err error
	if messages, err = consume.SharedCollector(reg, messages); err != nil {
		return nil, err
	}
	if duration, err = consume.SharedCollector(reg, duration); err != nil {
		return nil, err
	}
	if inFlight, err = consume.SharedCollector(reg, inFlight); err != nil {
		return nil, err
	}
	if settleErrors, err = consume.SharedCollector(reg, settleErrors); err != nil {
		return nil, err
	}
	if deleteBatch, err = consume.SharedCollector(reg, deleteBatch); err != nil {
		return nil, err
	}
	l := prometheus.Labels{"queue": queue}
	return &metrics{
		messages:     messages.MustCurryWith(l),
		duration:     duration.MustCurryWith(l),
		inFlight:     inFlight.With(l),
		settleErrors: settleErrors.MustCurryWith(l),
		deleteBatch:  deleteBatch.With(l),
	}, nil
}
