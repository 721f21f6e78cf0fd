package onceonly_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/internal/testenv"
)

// TestMain fails the package's tests when a goroutine outlives them, and
// gives the runnable examples DATABASE_URL and REDIS_URL of their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.WithExampleEnv(m, "onceonly"))
}
