// Package promutil holds the small Prometheus helpers the library packages
// share.
package promutil

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector with reg; a nil reg registers nothing,
// so metrics stay private to the caller.
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// Shared registers c with reg (nil: nothing), or returns the collector
// registered there already under the same description, so that several
// consumers (queues, streams, routers) share one registry's metrics.
func Shared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("register metrics: %w", err)
	}
	return c, nil
}
