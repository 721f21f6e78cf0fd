package consume

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/internal/promutil"
)

// SharedCollector registers c with reg (a nil reg: nothing), or returns the
// collector registered there already under the same description, so that
// several consumers of one integration (queues, streams, routers) share one
// registry's metrics instead of failing to register them twice.
func SharedCollector[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	return promutil.Shared(reg, c)
}
