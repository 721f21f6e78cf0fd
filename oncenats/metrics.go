package oncenats

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/consume"
)

// The reason label of onceonly_nats_messages_total, besides the
// dead-letter reasons of onceonly (reused, invalid, failed) and the
// reasons consume.Reason names (executed, replayed, in_flight, failed,
// handed_off, error), these.
const (
	reasonDeadLetterFailed = "dead_letter_failed" // retry: the copy was not published
	reasonShutdown         = "shutdown"           // retry: handed back unstarted
)

// The op label of onceonly_nats_settle_errors_total.
const (
	opAck        = "ack"
	opNak        = "nak"
	opTerm       = "term"
	opInProgress = "in_progress"
	opDeadLetter = "dead_letter"
	opConsume    = "consume"
)

type metrics struct {
	messages     *prometheus.CounterVec
	duration     prometheus.ObserverVec
	inFlight     prometheus.Gauge
	settleErrors *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, stream, consumer string) (*metrics, error) {
	labels := []string{"stream", "consumer"}
	messages := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_nats_messages_total",
		Help: "Messages settled, by stream, consumer, disposition (ack, retry, dead_letter) and reason: executed or replayed (ack); in_flight, failed, handed_off, error, dead_letter_failed or shutdown (retry); reused, invalid or failed (dead_letter).",
	}, append(labels, "disposition", "reason"))
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "onceonly_nats_message_duration_seconds",
		Help:    "Time from a message's arrival at a worker to its settlement, by stream, consumer and disposition.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, append(labels, "disposition"))
	inFlight := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "onceonly_nats_messages_in_flight",
		Help: "Messages being handled now, by stream and consumer.",
	}, labels)
	settleErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_nats_settle_errors_total",
		Help: "Calls to the server that failed, by stream, consumer and op (ack, nak, term, in_progress, dead_letter, consume); an unsettled message comes back after AckWait.",
	}, append(labels, "op"))
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
	l := prometheus.Labels{"stream": stream, "consumer": consumer}
	return &metrics{
		messages:     messages.MustCurryWith(l),
		duration:     duration.MustCurryWith(l),
		inFlight:     inFlight.With(l),
		settleErrors: settleErrors.MustCurryWith(l),
	}, nil
}
