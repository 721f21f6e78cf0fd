package onceonly

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/internal/promutil"
)

// Outcome labels of onceonly_requests_total.
const (
	outcomeExecuted      = "executed"
	outcomeReplayedCache = "replayed_cache"
	outcomeReplayedDB    = "replayed_db"
	outcomeInFlight      = "in_flight"
	outcomeReused        = "reused"
	outcomeFailed        = "failed"
	outcomeLeaseLost     = "lease_lost"
	outcomeUnavailable   = "unavailable"
	outcomeInvalid       = "invalid"
	outcomeHandlerError  = "handler_error"
	outcomePanic         = "panic"
	outcomeAskedAgain    = "" // not a label: the request is judged again, with an older fingerprint
	redisOpCheck         = "check"
	redisOpApply         = "apply"
	redisOpRelease       = "release"
	redisOpWatch         = "watch"
)

// outcomes are the labels of onceonly_requests_total and
// onceonly_resumptions_total.
var outcomes = []string{
	outcomeExecuted, outcomeReplayedCache, outcomeReplayedDB, outcomeInFlight, outcomeReused, outcomeFailed,
	outcomeLeaseLost, outcomeUnavailable, outcomeInvalid, outcomeHandlerError, outcomePanic,
}

// Who runs an execution: the by label of onceonly_executions_total.
const (
	// byFirst: the request (or delivery) that claimed a key with no
	// execution to continue: a new key, a failed one, an expired one.
	byFirst = "first"
	// byTakeover: a retry or redelivery that took over an execution whose
	// lease ran out (its holder died, or handed it off).
	byTakeover = "takeover"
	// byResumer: the engine's Resume, finishing an execution that started
	// a step, without any request.
	byResumer = "resumer"
)

type metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	redisFallback *prometheus.CounterVec
	resumptions   *prometheus.CounterVec
	executions    *prometheus.CounterVec
	waits         prometheus.Counter
	claimBatches  prometheus.Histogram
	claimFailures prometheus.Counter
}

// labelOutcome is the label of the per-outcome metrics.
const labelOutcome = "outcome"

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_requests_total",
			Help: "Idempotent requests by outcome.",
		}, []string{labelOutcome}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceonly_request_duration_seconds",
			Help:    "Time spent in the engine per request, handler included, by outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{labelOutcome}),
		redisFallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_redis_fallback_total",
			Help: "Redis calls that failed or timed out; the engine carried on from Postgres.",
		}, []string{"op"}),
		resumptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_resumptions_total",
			Help: "Executions a live engine took over and finished after their holder died or handed off, by outcome.",
		}, []string{labelOutcome}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceonly_executions_total",
			Help: "Executions that ran a handler, by who ran it (first, takeover, resumer) and by outcome.",
		}, []string{"by", labelOutcome}),
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_waits_total",
			Help: "Requests that found their key in flight and waited for its answer (MiddlewareOptions.Wait).",
		}),
		claimBatches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceonly_claim_batch_size",
			Help:    "Claims per batch sent to Postgres (Config.Tuning.NoClaimBatching turns batching off).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		claimFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceonly_claim_batch_failures_total",
			Help: "Batches of claims that failed (Postgres unreachable, or a wait for another transaction's key past 50ms); their claims were sent one by one.",
		}),
	}
	// Every outcome and operation is exported from the start, at 0, so a
	// rate or an alert over them has a series before the first event.
	for _, outcome := range outcomes {
		m.requests.WithLabelValues(outcome)
		m.resumptions.WithLabelValues(outcome)
	}
	for _, op := range []string{redisOpCheck, redisOpApply, redisOpRelease, redisOpWatch} {
		m.redisFallback.WithLabelValues(op)
	}
	if err := promutil.Register(reg, m.requests, m.duration, m.redisFallback, m.resumptions, m.executions, m.waits, m.claimBatches, m.claimFailures); err != nil {
		return nil, err
	}
	return m, nil
}

// observe counts a request that began at start and ended with outcome.
func (m *metrics) observe(outcome string, start time.Time) {
	if outcome == outcomeAskedAgain {
		return // the inner call counts the request
	}
	m.requests.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
}
