package daemon

import (
	"errors"
	"time"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/config"
)

// Engine is the engine's settings of a command that runs handlers (the
// api, the consumer).
type Engine struct {
	LeaseTimeout, CompletedTTL, FailedTTL, ResumeInterval *time.Duration
}

// DefineEngine defines the engine's settings on s; command names the
// command in their help.
func DefineEngine(s *config.Set, command string) *Engine {
	return &Engine{
		LeaseTimeout:   s.Duration("lease-timeout", "LEASE_TIMEOUT", onceonly.DefaultLeaseTimeout, "how long a claim holds a key without a heartbeat"),
		CompletedTTL:   s.Duration("completed-ttl", "COMPLETED_TTL", onceonly.DefaultCompletedTTL, "how long completed keys are kept"),
		FailedTTL:      s.Duration("failed-ttl", "FAILED_TTL", onceonly.DefaultFailedTTL, "how long failed keys are kept"),
		ResumeInterval: s.Duration("resume-interval", "RESUME_INTERVAL", onceonly.DefaultResumeInterval, "how often the "+command+" looks for executions whose holder died after calling the gateway, to finish them"),
	}
}

// Validate checks the settings (parsed); the error is one line.
func (e *Engine) Validate() error {
	if *e.ResumeInterval <= 0 {
		return errors.New("bad configuration: RESUME_INTERVAL must be positive")
	}
	return nil
}

// Config returns the engine's configuration with these settings (Pool,
// Redis and the rest are the caller's to fill).
func (e *Engine) Config() onceonly.Config {
	return onceonly.Config{
		LeaseTimeout: *e.LeaseTimeout, CompletedTTL: *e.CompletedTTL, FailedTTL: *e.FailedTTL,
		ResumeInterval: *e.ResumeInterval,
	}
}
