//go:build unix

package shutdown_test

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
)

// TestSignalContext: SIGTERM (as an orchestrator sends) ends the context
// instead of the process.
func TestSignalContext(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		ctx, stop := shutdown.SignalContext()
		require.NoError(t, syscall.Kill(os.Getpid(), sig))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%v did not end the context", sig)
		}
		stop()
	}
}
