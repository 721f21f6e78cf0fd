package citus

import (
	"testing"

	"github.com/onceonly/onceonly/oncetest"
)

// stack is the system on a migrated Citus database of the test's own.
type stack struct {
	db string
	// env is what every command gets: DATABASE_URL at the coordinator,
	// the Redis, LOG_LEVEL.
	env []string
}

// newStack makes a database of the test's own on the
// cluster and runs `api migrate up` on it. redisEnv points the commands at
// a Redis (REDIS_URL=…, REDIS_PREFIX=…); none: the shared test Redis under
// a key prefix of the test's own.
func newStack(t *testing.T, redisEnv ...string) *stack {
	t.Helper()
	if len(redisEnv) == 0 {
		_, prefix := oncetest.Redis(t)
		redisEnv = []string{"REDIS_URL=" + oncetest.RedisURL(t), "REDIS_PREFIX=" + prefix}
	}
	s := &stack{db: oncetest.CitusDatabaseURL(t)}
	migrateUp(t, s.db)
	s.env = append([]string{"DATABASE_URL=" + s.db, "LOG_LEVEL=warn"}, redisEnv...)
	return s
}

// start starts the command bin (of bins) with s.env and extra, and waits
// until it is ready; if the test fails, the end of its log is shown under
// name.
func (s *stack) start(t *testing.T, name, bin string, extra ...string) *oncetest.Daemon {
	t.Helper()
	d := oncetest.StartDaemon(t, bins+"/"+bin, append(append([]string{}, s.env...), extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			logs := d.Logs.String()
			t.Logf("--- %s log tail:\n%s", name, logs[max(0, len(logs)-4000):])
		}
	})
	return d
}

// baseURL returns a daemon's base URL.
func baseURL(d *oncetest.Daemon) string { return "http://" + d.Addr }

// run runs the command bin with args to completion, with s.env, and returns
// its stdout.
func (s *stack) run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	return runCommand(t, bins+"/"+bin, s.env, args...)
}
