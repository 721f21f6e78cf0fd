package oncenats_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

func TestDeclare(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	nc, err := nats.Connect(oncetest.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	sfx := oncetest.RandomSuffix(10)
	topo := oncenats.Topology{
		Stream: "D_" + sfx, Subject: "d." + sfx + ".charge", DeadLetterSubject: "d." + sfx + ".dead",
		Consumer: "c", AckWait: 20 * time.Second,
	}
	t.Cleanup(func() { _ = js.DeleteStream(ctx, topo.Stream) })

	// Several processes start at once: each finds or makes the same topology.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = topo.Declare(ctx, js) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	cons, err := topo.Declare(ctx, js) // and again
	require.NoError(t, err)

	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, "c", info.Config.Durable)
	require.Equal(t, topo.Subject, info.Config.FilterSubject)
	require.Equal(t, jetstream.AckExplicitPolicy, info.Config.AckPolicy)
	require.Equal(t, 20*time.Second, info.Config.AckWait)
	require.Equal(t, -1, info.Config.MaxDeliver)
	stream, err := js.Stream(ctx, topo.Stream)
	require.NoError(t, err)
	require.Equal(t, jetstream.FileStorage, stream.CachedInfo().Config.Storage)
	require.ElementsMatch(t, []string{topo.Subject, topo.DeadLetterSubject}, stream.CachedInfo().Config.Subjects)

	// An existing stream that does not take the dead-letter subject.
	other := topo
	other.DeadLetterSubject = "d." + sfx + ".elsewhere"
	_, err = other.Declare(ctx, js)
	require.ErrorContains(t, err, "does not take subject")
}

func TestDemoTopology(t *testing.T) {
	t.Parallel()
	topo := oncenats.DemoTopology()
	require.Equal(t, oncenats.Topology{
		Stream: "PAYMENTS", Subject: "payments.charge", DeadLetterSubject: "payments.dead",
		Consumer: "payments", AckWait: 30 * time.Second,
	}, topo)
}
