package oncenats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

func TestCopiesRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.run(t, effect, b.options())

	// Three copies of one message, published at once (no Nats-Msg-Id, so
	// JetStream keeps all three), and a message of another key.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { b.publish(t, "order-1", `{"amount":100}`) })
	}
	wg.Wait()
	b.publish(t, "order-2", `{"amount":200}`)

	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.rows(t, "order-2"))
	require.Equal(t, 2, b.count(t, "ack", "executed"))
	require.Equal(t, 2, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t))
}

func TestTxConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c, err := oncenats.NewTxConsumer(b.engine, func(ctx context.Context, tx pgx.Tx, msg oncenats.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`, msg.Scope, msg.Key, string(msg.Payload))
		return err
	}, b.options())
	require.NoError(t, err)
	b.runConsumer(t, c)

	for range 3 {
		b.publish(t, "order-1", `{"amount":100}`)
	}
	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 2, b.count(t, "ack", "replayed"))
}

func TestReusedKeyIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.run(t, effect, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 10*time.Second)
	b.publish(t, "order-1", `{"amount":999}`) // the same key, another payload

	dead := b.awaitDeadLetters(t, 1)[0]
	require.Equal(t, `{"amount":999}`, string(dead.Data()))
	require.Equal(t, "order-1", dead.Headers().Get(oncenats.DefaultKeyHeader))
	require.Equal(t, onceonly.ReasonReused, dead.Headers().Get(oncenats.HeaderReason))
	require.Equal(t, "dead/2", dead.Headers().Get(nats.MsgIdHdr)) // the reused message's stream sequence
	require.Equal(t, b.topo.Subject, dead.Headers().Get(oncenats.HeaderSubject))
	// Terminated: not waiting for an ack, never delivered again.
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "dead_letter", onceonly.ReasonReused))
	require.Zero(t, b.info(t).NumRedelivered)
}

func TestInvalidMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opts := b.options()
	opts.Payload = func(msg jetstream.Msg) ([]byte, error) {
		if string(msg.Data()) == "panic" {
			panic("a decoder bug")
		}
		var order struct {
			Amount int `json:"amount"`
		}
		if err := json.Unmarshal(msg.Data(), &order); err != nil {
			return nil, fmt.Errorf("an order is JSON: %w", err)
		}
		if order.Amount < 1 {
			return nil, fmt.Errorf("%w: an order needs a positive amount", onceonly.ErrInvalidMessage)
		}
		return msg.Data(), nil
	}
	b.run(t, effect, opts)

	b.publish(t, "", `{"amount":100}`)        // no key
	b.publish(t, "order 1", `{"amount":100}`) // a key with a space
	b.publish(t, "order-2", `not json`)       // a payload Options.Payload refuses
	b.publish(t, "order-3", `{"amount":-1}`)  // likewise
	b.publish(t, "order-5", `panic`)          // a payload Options.Payload panics on
	b.publish(t, "order-4", `{"amount":100}`) // valid

	dead := b.awaitDeadLetters(t, 5)
	for _, msg := range dead {
		require.Equal(t, onceonly.ReasonInvalid, msg.Headers().Get(oncenats.HeaderReason), msg.Headers().Get(oncenats.HeaderError))
	}
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.keyRows(t), "an invalid message leaves no key")
	require.Equal(t, 1, b.rows(t, "order-4"))
	require.Equal(t, 5, b.count(t, "dead_letter", onceonly.ReasonInvalid))
}

func TestFailedExecutionRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var calls atomic.Int32
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		switch calls.Add(1) {
		case 1:
			return errors.New("the ledger is down")
		case 2:
			panic("a handler bug") // a failure too, and the process lives on
		}
		return effect(ctx, msg)
	}, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}, b.retries(), "MinBackoff doubled per failure")
	require.Equal(t, 2, b.count(t, "retry", "failed"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
}

func TestRepeatedFailureIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var calls atomic.Int32
	opts := b.options()
	opts.Policy.MaxFailures = 3
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		calls.Add(1)
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, 'partial')`, msg.Scope, msg.Key); err != nil {
			return err
		}
		return errors.New("the gateway declined to answer")
	}, opts)

	b.publish(t, "order-1", `{"amount":100}`)
	dead := b.awaitDeadLetters(t, 1)[0]
	require.Equal(t, onceonly.ReasonFailed, dead.Headers().Get(oncenats.HeaderReason))
	require.Contains(t, dead.Headers().Get(oncenats.HeaderError), "the gateway declined to answer")
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, int32(3), calls.Load(), "dead-lettered after MaxFailures executions")
	require.Zero(t, b.rows(t, "order-1"), "a failed execution's writes are rolled back")
	require.Equal(t, 2, b.count(t, "retry", "failed"))
}

func TestCopyOfKeyInFlightComesBack(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	held := effectAfter(release)
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		once.Do(func() { close(started) })
		return held(ctx, msg)
	}, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	b.publish(t, "order-1", `{"amount":100}`) // a copy while the first runs
	oncetest.Eventually(t, 10*time.Second, "the copy turned away while the key is in flight", func() bool {
		return b.count(t, "retry", "in_flight") >= 1
	})
	require.Zero(t, b.count(t, "ack", "replayed"))
	close(release)

	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 1, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t), "a key in flight is never dead-lettered")
	for _, after := range b.retries() {
		require.LessOrEqual(t, after, onceonly.MaxInFlightRetry, "a copy comes back within about its Retry-After")
	}
}

func TestLongExecutionKeepsItsMessage(t *testing.T) {
	t.Parallel()
	// InProgress goes every third of AckWait: 2 s leaves a loaded machine
	// room for a late tick, which 1 s did not.
	const ackWait = 2 * time.Second
	b := setup(t, setupOpts{ackWait: ackWait})
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var delivered atomic.Uint64
	held := effectAfter(release)
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		calls.Add(1)
		md, err := msg.Msg.Metadata()
		if err != nil {
			return err
		}
		delivered.Store(md.NumDelivered)
		// An execution that outlives its lease steps first: the step
		// commits its claim, whose lease the engine then renews (one that
		// never steps is ended by Postgres at the lease, issue 28).
		if _, err := onceonly.Step(ctx, "begin", func(context.Context, string) (int, error) { return 0, nil }); err != nil {
			return err
		}
		close(started)
		return held(ctx, msg)
	}, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	// Three AckWaits pass while the execution runs (an absence is shown
	// over time): the server must not deliver the message again meanwhile.
	deadline := time.Now().Add(3 * ackWait)
	for time.Now().Before(deadline) {
		ci := b.info(t)
		require.Zero(t, ci.NumRedelivered, "the message was delivered again while its execution ran")
		require.Equal(t, 1, ci.NumAckPending)
		time.Sleep(100 * time.Millisecond)
	}
	close(release)

	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, uint64(1), delivered.Load())
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Zero(t, b.count(t, "retry", "in_flight"))
}

func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := oncetest.NewNATSServer(t)
	b := setup(t, setupOpts{natsURL: srv.URL()})
	b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		time.Sleep(10 * time.Millisecond) // keep some messages in flight when the server dies
		return effect(ctx, msg)
	}, b.options())

	const keys = 60
	publishAll := func(from, to int) {
		for i := from; i < to; i++ {
			for range 1 + i%3 { // one to three copies
				b.publish(t, "order-"+strconv.Itoa(i), `{"amount":`+strconv.Itoa(i+1)+`}`)
			}
		}
	}
	publishAll(0, keys/2)
	oncetest.Eventually(t, 20*time.Second, "some messages executed", func() bool {
		return b.count(t, "ack", "executed") >= 5
	})
	srv.Restart() // SIGKILL, then the same store
	publishAll(keys/2, keys)

	b.awaitSettled(t, 60*time.Second)
	for i := range keys {
		require.Equal(t, 1, b.rows(t, "order-"+strconv.Itoa(i)), "order-%d", i)
	}
	require.Equal(t, keys, b.keyRows(t))
	require.Empty(t, b.deadLetters(t))
}

func TestConsumerDeclaredAndDeclaredAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	stream, err := b.js.Stream(b.ctx, b.topo.Stream)
	require.NoError(t, err)
	require.NoError(t, stream.DeleteConsumer(b.ctx, b.topo.Consumer))
	b.publish(t, "order-1", `{"amount":100}`)

	// Declare makes the missing consumer at start…
	opts := b.options()
	opts.Declare = b.topo.Declare
	c, err := oncenats.NewConsumer(b.engine, effect, opts)
	require.NoError(t, err)
	b.runConsumer(t, c)
	oncetest.Eventually(t, 10*time.Second, "order-1 done", func() bool { return b.rows(t, "order-1") == 1 })
	require.True(t, c.Connected())

	// …and again when it is deleted under the running consumer: the
	// messages published meanwhile are consumed by the new one.
	require.NoError(t, stream.DeleteConsumer(b.ctx, b.topo.Consumer))
	b.publish(t, "order-2", `{"amount":200}`)
	oncetest.Eventually(t, 20*time.Second, "order-2 done by the declared-again consumer", func() bool {
		return b.rows(t, "order-2") == 1
	})
	require.Equal(t, 1, b.rows(t, "order-1"))
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	// order-1's execution (one commit, no step) waits while the test
	// publishes order-2 and stops the consumer, which takes seconds under
	// load: past the 2 s lease Postgres ends it, and its effect is lost. The
	// test is of the shutdown, not of leases: a lease longer than its waits.
	b := setup(t, setupOpts{ackWait: 30 * time.Second, lease: time.Minute})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	handler := func(ctx context.Context, msg oncenats.Message) error {
		if msg.Key == "order-1" {
			once.Do(func() { close(started) })
			<-release
		}
		return effect(ctx, msg)
	}
	opts := b.options()
	opts.Workers = 1
	opts.ShutdownTimeout = 10 * time.Second
	stop := b.run(t, handler, opts)

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	b.publish(t, "order-2", `{"amount":200}`) // arrives while order-1 runs
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	<-stopped
	// The execution under way finished and was acked; order-2 was handed
	// back (or never fetched), not left to the 30s AckWait.
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Zero(t, b.rows(t, "order-2"))

	opts.Name = "second" // a second consumer on the same engine registers a name of its own
	b.run(t, handler, opts)
	b.awaitSettled(t, 10*time.Second) // well before AckWait
	require.Equal(t, 1, b.rows(t, "order-2"))
}

func TestShutdownBound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	started := make(chan struct{})
	opts := b.options()
	opts.ShutdownTimeout = 300 * time.Millisecond
	stop := b.run(t, func(ctx context.Context, msg oncenats.Message) error {
		close(started)
		<-ctx.Done() // runs until canceled
		return ctx.Err()
	}, opts)
	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	begin := time.Now()
	stop()
	require.Less(t, time.Since(begin), 5*time.Second)
	require.Zero(t, b.rows(t, "order-1"))
}

func TestRunEndsWhenTheConnectionCloses(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	nc, err := nats.Connect(oncetest.NATSURL(t)) // a connection of the consumer's own, closed below
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	opts := b.options()
	opts.JetStream = js
	c, err := oncenats.NewConsumer(b.engine, effect, opts)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(b.ctx) }()
	<-c.Started()
	oncetest.Eventually(t, 10*time.Second, "connected", c.Connected)
	nc.Close()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "connection is closed")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the connection closed")
	}
	require.False(t, c.Connected())
}

func TestNewConsumerChecksOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := oncenats.NewConsumer(b.engine, nil, b.options())
	require.Error(t, err)
	_, err = oncenats.NewConsumer(nil, effect, b.options())
	require.Error(t, err)
	for name, change := range map[string]func(*oncenats.Options){
		"no JetStream": func(o *oncenats.Options) { o.JetStream = nil },
		"no stream":    func(o *oncenats.Options) { o.Stream = "" },
		"no consumer":  func(o *oncenats.Options) { o.Consumer = "" },
		"no scope":     func(o *oncenats.Options) { o.Scope = "" },
		"bad scope":    func(o *oncenats.Options) { o.Scope = "a:b" },
		"negative":     func(o *oncenats.Options) { o.Workers = -1 },
	} {
		opts := b.options()
		change(&opts)
		_, err := oncenats.NewConsumer(b.engine, effect, opts)
		require.Error(t, err, name)
	}

	// A consumer that does not ack explicitly ends Run with an error.
	stream, err := b.js.Stream(b.ctx, b.topo.Stream)
	require.NoError(t, err)
	_, err = stream.CreateConsumer(b.ctx, jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckAllPolicy, FilterSubject: b.topo.Subject})
	require.NoError(t, err)
	opts := b.options()
	opts.Consumer = "all"
	c, err := oncenats.NewConsumer(b.engine, effect, opts)
	require.NoError(t, err)
	require.ErrorContains(t, c.Run(b.ctx), "must ack explicitly")
}
