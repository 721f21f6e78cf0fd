package relaywake

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestKicksCoalesce: kicks that arrive while a NOTIFY is on its way are
// answered by one more NOTIFY, not one each; Stop ends the loop.
func TestKicksCoalesce(t *testing.T) {
	t.Parallel()
	var sent atomic.Int32
	inFlight, release := make(chan struct{}), make(chan struct{})
	w := New(func(context.Context) error {
		if sent.Add(1) == 1 {
			close(inFlight)
			<-release
		}
		return nil
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, w.Start(t.Context()))
	w.Kick()
	<-inFlight
	for range 100 {
		w.Kick()
	}
	close(release)
	require.Eventually(t, func() bool { return sent.Load() == 2 }, 5*time.Second, time.Millisecond)
	w.Stop()
	require.EqualValues(t, 2, sent.Load(), "100 kicks during one NOTIFY cost one more")
	w.Stop() // twice is safe
}
