package gateway_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them (a call
// left hanging, a server or pool not closed).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
