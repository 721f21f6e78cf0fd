package oncewatermill

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// metrics are the middleware's Prometheus metrics.
type metrics struct {
	// messages: handler, disposition (ack, retry, dead_letter), reason.
	messages *prometheus.CounterVec
	waiting  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	messages := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceonly_watermill_messages_total",
		Help: "Messages settled by the oncewatermill middleware, by router handler, disposition (ack, retry, dead_letter) and reason: executed or replayed (ack); in_flight, conflict (a joined transaction's snapshot is older than the key's row), failed, handed_off or error (retry); reused, invalid or failed (dead_letter).",
	}, []string{"handler", "disposition", "reason"})
	waiting := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "onceonly_watermill_waiting_messages",
		Help: "Messages the oncewatermill middleware holds until their retry delay passes and it nacks them; each holds its handler goroutine and its place in the subscription.",
	})
	var err error
	if messages, err = consume.SharedCollector(reg, messages); err != nil {
		return nil, err
	}
	if waiting, err = consume.SharedCollector(reg, waiting); err != nil {
		return nil, err
	}
	return &metrics{messages: messages, waiting: waiting}, nil
}

// reasonConflict is a reason of onceonly_watermill_messages_total besides
// the dead-letter reasons of onceonly (reused, invalid, failed) and those
// consume.Reason names: a joined transaction's snapshot is older than the
// key's row (retry).
const reasonConflict = "conflict"

// reasonOf names why a message was settled as it was.
func reasonOf(s onceonly.Settlement) string {
	reason := consume.Reason(s)
	if reason == consume.ReasonError && serializationFailure(s.Err) {
		return reasonConflict
	}
	return reason
}
