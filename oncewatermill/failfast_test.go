package oncewatermill_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncewatermill"
)

// An engine whose schema is gone (rolled back after New): the middleware
// calls Options.Stop with ErrSchemaBehind, which names the fix, and nacks
// the message instead of poisoning it. On AMQP only: watermill-sql's
// subscriber commits its transaction as it closes, under a handler still
// running in it, which the race detector reports whatever the handler
// (DoTx's answer to a missing schema is tested in the engine's package).
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	func(t *testing.T, b *testBundle) {
		_, err := b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
		require.NoError(t, err)
		poisoned := b.collect(t, b.poison)
		stopped := make(chan error, 1)
		handle := func(msg *message.Message) ([]*message.Message, error) { return nil, writeEffect(msg) }
		s := b.startRouter(t, handle, routerOptions{opts: oncewatermill.Options{Stop: func(err error) { stopped <- err }}})
		b.publish(t, "order-1", `{"amount":100}`)

		select {
		case err := <-stopped:
			require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
		case <-time.After(30 * time.Second):
			t.Fatal("Options.Stop not called within 30s")
		}
		st := s.next(t)
		require.Equal(t, onceonly.Retry, st.Disposition)
		require.ErrorIs(t, st.Err, onceonly.ErrSchemaBehind)
		requireNone(t, poisoned, 500*time.Millisecond)
	}(t, setup(t, pubSubs[2]))
}
