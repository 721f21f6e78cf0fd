// Package promutil holds the small Prometheus helpers the library packages
// share.
package promutil

import (
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
