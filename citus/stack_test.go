package citus

import (
	"testing"

	"github.com/onceonly/onceonly/internal/testenv"
)

// stack is the system on a migrated Citus database of the test's own.
type stack struct {
	bins string
	db   string
	// env is what every command gets: DATABASE_URL at the coordinator,
	// the Redis, LOG_LEVEL.
	env []string
}

// newStack builds the commands, makes a database of the test's own on the
// cluster and runs `api migrate up` on it. redisEnv points the commands at
// a Redis (REDIS_URL=…, REDIS_PREFIX=…); none: the shared test Redis under
// a key prefix of the test's own.
func newStack(t *testing.T, redisEnv ...string) *stack {
	t.Helper()
	if len(redisEnv) == 0 {
		_, prefix := testenv.Redis(t)
		redisEnv = []string{"REDIS_URL=" + testenv.RedisURL(t), "REDIS_PREFIX=" + prefix}
	}
	s := &stack{bins: commands(t), db: citusDatabase(t)}
	migrateUp(t, s.bins, s.db)
	s.env = append([]string{"DATABASE_URL=" + s.db, "LOG_LEVEL=warn"}, redisEnv...)
	return s
}

// start starts the command name (a binary of s.bins) with s.env and extra.
func (s *stack) start(t *testing.T, name, bin string, extra ...string) *daemon {
	t.Helper()
	return startDaemon(t, name, s.bins+"/"+bin, append(append([]string{}, s.env...), extra...)...)
}

// run runs the command bin with args to completion, with s.env, and returns
// its stdout.
func (s *stack) run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	return runCommand(t, s.bins+"/"+bin, s.env, args...)
}
