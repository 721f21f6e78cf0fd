package onceonly_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/oncetest"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable examples DATABASE_URL and REDIS_URL of their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "onceonly"))
}
