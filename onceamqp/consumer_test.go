package onceamqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncetest"
)

// A message published three times at once has one effect, and every copy
// is acked: the queue ends empty, nothing is dead-lettered.
func TestCopiesHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.start(t, writeEffect, onceamqp.Options{Workers: 3})

	var wg sync.WaitGroup
	for range 3 {
		ch := b.channel(t)
		wg.Go(func() { b.publish(t, ch, "order-1", `{"amount":100}`) })
	}
	wg.Wait()
	b.awaitSettled(t, 3, "ack", "")
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
	require.Equal(t, 1, b.settled(t, "ack", "executed"))
	require.Equal(t, 2, b.settled(t, "ack", "replayed"))

	require.Zero(t, oncetest.Metric(t, b.reg, "onceonly_amqp_settle_errors_total", nil), "an ack did not reach the broker")
	c.Stop() // anything left unacked would be requeued now
	require.Zero(t, b.ready(t, b.queue.Name))
	require.Zero(t, b.ready(t, b.queue.DeadLetterQueue))
}

// A key sent again with another body is dead-lettered (x-death), and its
// body has no effect.
func TestReusedKeyIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, writeEffect, onceamqp.Options{})
	ch := b.channel(t)

	b.publish(t, ch, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 1, "ack", "executed")
	b.publish(t, ch, "order-1", `{"amount":999}`)

	d := b.deadLetter(t)
	require.Equal(t, "order-1", d.MessageId)
	require.JSONEq(t, `{"amount":999}`, string(d.Body))
	requireDeath(t, d, b.queue.Name)
	require.Equal(t, 1, b.settled(t, "dead_letter", onceonly.ReasonReused))
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
}

// A message without a usable key, or one its decoder refuses, is
// dead-lettered as invalid, and the engine writes no key for it.
func TestInvalidMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A TxHandler (Engine.Do) that decodes the body as JSON first.
	c, err := onceamqp.NewTxConsumer(b.engine, recordEffect, b.options(onceamqp.Options{
		Payload: func(d *amqp.Delivery) ([]byte, error) {
			if string(d.Body) == "panic" {
				panic("a decoder bug")
			}
			var v map[string]any
			if err := json.Unmarshal(d.Body, &v); err != nil {
				return nil, err
			}
			return d.Body, nil
		},
	}))
	require.NoError(t, err)
	b.run(t, c)
	ch := b.channel(t)

	for _, m := range []struct{ id, body string }{
		{"", `{"amount":100}`},          // no message-id
		{"has space", `{"amount":100}`}, // not a valid key
		{"order-2", `{"amount":`},       // the decoder fails
		{"order-3", `panic`},            // the decoder panics
	} {
		b.publish(t, ch, m.id, m.body)
		d := b.deadLetter(t)
		require.Equal(t, m.id, d.MessageId)
		requireDeath(t, d, b.queue.Name)
	}
	require.Equal(t, 4, b.settled(t, "dead_letter", onceonly.ReasonInvalid))
	require.Zero(t, b.keyRows(t), "an invalid message wrote a key")
	require.Empty(t, b.effects(t, "order-2"))
}

// A handler that fails twice is run again after a backoff each time, and
// its third run's effect is the only one.
func TestFailedExecutionComesAgainAfterBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs attempts
	const minBackoff = 300 * time.Millisecond
	b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		if runs.add(msg.Key) <= 2 {
			return errors.New("the ledger is not ready")
		}
		return writeEffect(ctx, msg)
	}, onceamqp.Options{Policy: onceonly.SettlePolicy{MinBackoff: minBackoff, MaxBackoff: time.Second}})

	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	b.awaitSettled(t, 1, "ack", "executed")
	at := runs.of("order-1")
	require.Len(t, at, 3)
	// MinBackoff after the first failure, doubled after the second.
	require.GreaterOrEqual(t, at[1].Sub(at[0]), minBackoff, "run 2 came back before the backoff")
	require.GreaterOrEqual(t, at[2].Sub(at[1]), 2*minBackoff, "run 3 came back before the doubled backoff")
	require.Equal(t, 2, b.settled(t, "retry", ""))
	require.Zero(t, b.settled(t, "dead_letter", ""))
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
}

// A handler that panics fails its execution, and the consumer lives on: the
// message comes again and its next run's effect is the only one.
func TestHandlerPanicFailsTheExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs attempts
	c, err := onceamqp.NewTxConsumer(b.engine, func(ctx context.Context, tx pgx.Tx, msg onceamqp.Message) error {
		if runs.add(msg.Key) == 1 {
			panic("a nil map somewhere")
		}
		return recordEffect(ctx, tx, msg)
	}, b.options(onceamqp.Options{}))
	require.NoError(t, err)
	b.run(t, c)

	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	b.awaitSettled(t, 1, "ack", "executed")
	require.Len(t, runs.of("order-1"), 2)
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
	require.True(t, c.Connected())
}

// After MaxFailures executions of a key ended failed, its delivery is
// dead-lettered with reason failed.
func TestDeadLetteredAfterMaxFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs attempts
	b.start(t, func(_ context.Context, msg onceamqp.Message) error {
		runs.add(msg.Key)
		return errors.New("the ledger is down")
	}, onceamqp.Options{Policy: onceonly.SettlePolicy{MaxFailures: 2, MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}})

	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	d := b.deadLetter(t)
	requireDeath(t, d, b.queue.Name)
	require.Equal(t, 1, b.settled(t, "dead_letter", onceonly.ReasonFailed))
	require.Len(t, runs.of("order-1"), 2)
	require.Empty(t, b.effects(t, "order-1"))
}

// A copy that arrives while the first delivery's execution runs is
// requeued, not dead-lettered, and acked once the first commits.
func TestCopyInFlightComesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, longLease)
	release := b.copyInFlight(t)
	b.awaitSettled(t, 2, "retry", "in_flight") // requeued, delivered again, requeued again
	require.Zero(t, b.settled(t, "dead_letter", ""))
	release()

	b.awaitSettled(t, 2, "ack", "")
	require.Equal(t, 1, b.settled(t, "ack", "replayed"))
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
	require.Zero(t, b.ready(t, b.queue.DeadLetterQueue))
}

// A step whose outcome is unknown hands the key off (it stays in
// progress): the delivery is requeued, never dead-lettered and not counted
// as a failure, until the key settles, here by a redelivery that takes the
// key over once its lease ran out and calls the step again with the same
// downstream key.
func TestUnknownStepOutcomeIsKeptUntilSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls attempts
	b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		charge, err := onceonly.Step(ctx, "charge", func(_ context.Context, key string) (string, error) {
			if calls.add(key) == 1 {
				return "", errors.New("the gateway timed out: charged or not, nobody knows")
			}
			return "ch_" + key, nil
		})
		if err != nil {
			return err
		}
		return writeEffect(ctx, onceamqp.Message{Key: msg.Key, Payload: []byte(charge)})
	}, onceamqp.Options{Policy: onceonly.SettlePolicy{MaxFailures: 1, MinBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}})

	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	b.awaitSettled(t, 1, "ack", "executed")
	downstream := onceonly.DownstreamKey("test", "order-1", "charge")
	require.Len(t, calls.of(downstream), 2, "the step was called again with its downstream key")
	require.Equal(t, []string{"ch_" + downstream}, b.effects(t, "order-1"))
	require.Equal(t, 1, b.settled(t, "retry", "handed_off"))
	require.Zero(t, b.settled(t, "retry", "failed"))
	require.Zero(t, b.settled(t, "dead_letter", ""))
}

// longLease gives an execution that waits on the test, without a step, a
// lease longer than any of the test's waits: it begins as one commit, which
// Postgres ends once it idles past the lease (I5), and the broker's round
// trips the test waits for take seconds on a loaded machine, past the 3 s
// of setup. These tests are of the consumer, not of leases.
func longLease(c *onceonly.Config) { c.LeaseTimeout = time.Minute }

// copyInFlight starts a consumer with two workers whose first execution
// waits, publishes order-1, and publishes a copy of it once that execution
// runs. It returns what lets the execution finish; the test's end lets it
// finish too, so that a failed test does not leave it blocking Stop. b's
// engine must have a lease longer than the test waits (longLease): the
// copy is only in flight while the first execution holds its key.
func (b *testBundle) copyInFlight(t *testing.T) (release func()) {
	t.Helper()
	entered, released := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	var once sync.Once
	b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		once.Do(func() {
			close(entered)
			<-released
		})
		return writeEffect(ctx, msg)
	}, onceamqp.Options{Workers: 2})
	t.Cleanup(release) // runs before the consumer's Stop, registered earlier
	ch := b.channel(t)
	b.publish(t, ch, "order-1", `{"amount":100}`)
	<-entered
	b.publish(t, ch, "order-1", `{"amount":100}`)
	return release
}

// On a quorum queue with a delivery limit the broker itself dead-letters a
// copy that was only requeued because its key was in flight (x-death
// reason delivery_limit), though the consumer would have acked it: why
// DeclareQueue sets no limit unless told to.
func TestDeliveryLimitDeadLettersCopiesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, longLease)
	b.queue.Name += ".limited"
	b.queue.DeadLetterExchange += ".limited"
	b.queue.DeadLetterQueue += ".limited"
	b.queue.DeliveryLimit = 1
	b.declare(t, b.queue)
	release := b.copyInFlight(t)
	d := b.deadLetter(t)
	release()
	deaths, _ := d.Headers["x-death"].([]any)
	require.NotEmpty(t, deaths)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	require.Equal(t, "delivery_limit", death["reason"])
	b.awaitSettled(t, 1, "ack", "executed")
	require.Zero(t, b.settled(t, "dead_letter", ""), "the consumer dead-lettered nothing itself")
}

// When the broker closes the consumer's connection, the consumer
// reconnects and drains the queue: an execution that committed without its
// ack getting through is replayed, not run again.
func TestReconnectsAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	// order-0's handler waits until the client saw its connection go, which
	// takes seconds on a loaded machine: longer than the 3 s lease. A
	// one-commit execution idles in its transaction meanwhile, and Postgres
	// ends it at the lease (I5), so the redelivery would run afresh rather
	// than replay; a two-phase one keeps its claim renewed while it waits.
	b := setup(t, func(c *onceonly.Config) { c.TwoPhase = true })
	name := "onceamqp-test-conn." + oncetest.RandomSuffix(8)
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	entered, closed := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(closed) })
	var once sync.Once
	c := b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		if msg.Key == "order-0" {
			once.Do(func() {
				close(entered)
				<-closed // commits after the connection is gone: its ack is lost
			})
		}
		return writeEffect(ctx, msg)
	}, onceamqp.Options{Workers: 2, AMQP: amqp.Config{Properties: props}})
	t.Cleanup(release) // a failed test does not leave Stop waiting on the handler
	ch := b.channel(t)
	const n = 6
	for i := range n {
		b.publish(t, ch, fmt.Sprintf("order-%d", i), fmt.Sprintf(`{"amount":%d}`, i))
	}
	<-entered
	require.Equal(t, 1, oncetest.CloseAMQPConnections(t, name))
	// The close reaches the client through the broker and amqp091's reader:
	// seconds on a loaded machine. The consumer may have reconnected by the
	// time this polls (a poll late under load missed the moment it was
	// down): a second connect says it noticed too.
	oncetest.Eventually(t, 30*time.Second, "the consumer noticed", func() bool {
		return !c.Connected() || oncetest.Metric(t, b.reg, "onceonly_amqp_connects_total", map[string]string{"result": "ok"}) >= 2
	})
	release()

	oncetest.Eventually(t, 20*time.Second, "every message handled once", func() bool {
		var keys int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT key) FROM effects`).Scan(&keys))
		return keys == n
	})
	// order-0's ack was lost with its channel: its redelivery is settled
	// as a replay, possibly after a second as a copy in flight.
	oncetest.Eventually(t, 20*time.Second, "order-0's redelivery replayed", func() bool {
		return b.settled(t, "ack", "replayed") >= 1
	})
	oncetest.Eventually(t, 20*time.Second, "the queue drained", func() bool {
		return c.Connected() && b.ready(t, b.queue.Name) == 0 && oncetest.Metric(t, b.reg, "onceonly_amqp_held_deliveries", nil) == 0
	})
	c.Stop()
	require.Zero(t, b.ready(t, b.queue.Name))
	require.Zero(t, b.ready(t, b.queue.DeadLetterQueue))
	for i := range n {
		require.Len(t, b.effects(t, fmt.Sprintf("order-%d", i)), 1)
	}
	require.GreaterOrEqual(t, oncetest.Metric(t, b.reg, "onceonly_amqp_connects_total", map[string]string{"result": "ok"}), 2.0)
	require.GreaterOrEqual(t, oncetest.Metric(t, b.reg, "onceonly_amqp_settle_errors_total", nil), 1.0, "the lost ack of order-0")
	require.GreaterOrEqual(t, b.settled(t, "ack", "replayed"), 1, "order-0's redelivery")
}

// Stop lets an execution under way commit and ack before it closes the
// channel.
func TestStopFinishesExecutionsUnderWay(t *testing.T) {
	t.Parallel()
	// The execution waits until the consumer stopped consuming: seconds
	// under load.
	b := setup(t, longLease)
	entered, release := make(chan struct{}), make(chan struct{})
	c := b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		close(entered)
		<-release
		return writeEffect(ctx, msg)
	}, onceamqp.Options{ShutdownTimeout: 30 * time.Second})
	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	<-entered

	stopped := make(chan struct{})
	go func() {
		c.Stop()
		close(stopped)
	}()
	oncetest.Eventually(t, 10*time.Second, "the consumer stopped consuming", func() bool { return !c.Connected() })
	select {
	case <-stopped:
		t.Fatal("Stop returned before the execution under way finished")
	default:
	}
	close(release)
	<-stopped
	require.Equal(t, []string{`{"amount":100}`}, b.effects(t, "order-1"))
	require.Equal(t, 1, b.settled(t, "ack", "executed"))
	require.Zero(t, b.ready(t, b.queue.Name))
}

// Past ShutdownTimeout, Stop cancels the execution under way and returns;
// the unsettled delivery goes back to the queue.
func TestStopIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered := make(chan struct{})
	const bound = 500 * time.Millisecond
	c := b.start(t, func(ctx context.Context, _ onceamqp.Message) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}, onceamqp.Options{ShutdownTimeout: bound})
	b.publish(t, b.channel(t), "order-1", `{"amount":100}`)
	<-entered

	began := time.Now()
	c.Stop()
	took := time.Since(began)
	require.GreaterOrEqual(t, took, bound)
	require.Less(t, took, bound+3*time.Second)
	// The broker requeues a closed channel's deliveries on its own time.
	oncetest.Eventually(t, 10*time.Second, "the delivery back in the queue", func() bool { return b.ready(t, b.queue.Name) == 1 })
	require.Empty(t, b.effects(t, "order-1"))
}

// The message reaches the handler as the engine stored it: scope, key and
// payload from the options' functions, and the delivery.
func TestHandlerSeesTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan onceamqp.Message, 1)
	b.start(t, func(ctx context.Context, msg onceamqp.Message) error {
		got <- msg
		return nil
	}, onceamqp.Options{
		ScopeOf: func(d *amqp.Delivery) (string, error) {
			var v struct {
				Merchant string `json:"merchant"`
			}
			err := json.Unmarshal(d.Body, &v)
			return v.Merchant, err
		},
		Key: onceamqp.HeaderKey("Idempotency-Key"),
	})
	ch := b.channel(t)
	require.NoError(t, ch.Confirm(false))
	confirm, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, "", b.queue.Name, true, false, amqp.Publishing{
		Headers: amqp.Table{"Idempotency-Key": "k-1"}, Body: []byte(`{"merchant":"acct_1"}`),
	})
	require.NoError(t, err)
	_, err = confirm.WaitContext(b.ctx)
	require.NoError(t, err)
	msg := <-got
	require.Equal(t, "acct_1", msg.Scope)
	require.Equal(t, "k-1", msg.Key)
	require.JSONEq(t, `{"merchant":"acct_1"}`, string(msg.Payload))
	require.NotNil(t, msg.Delivery)
	b.awaitSettled(t, 1, "ack", "executed")
	var status string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM idempotency_keys WHERE scope = 'acct_1' AND key = 'k-1'`).Scan(&status))
	require.Equal(t, "completed", status)
}

// NewConsumer refuses options that could not consume, or would
// dead-letter every message.
func TestOptionsAreChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, opts := range map[string]onceamqp.Options{
		"no URL":        {Queue: "q", Scope: "s"},
		"no queue":      {URL: b.url, Scope: "s"},
		"no scope":      {URL: b.url, Queue: "q"},
		"invalid scope": {URL: b.url, Queue: "q", Scope: "a:b"},
		"workers":       {URL: b.url, Queue: "q", Scope: "s", Workers: -1},
	} {
		_, err := onceamqp.NewConsumer(b.engine, writeEffect, opts)
		require.Error(t, err, name)
	}
	_, err := onceamqp.NewConsumer(b.engine, nil, onceamqp.Options{URL: b.url, Queue: "q", Scope: "s"})
	require.Error(t, err)
	_, err = onceamqp.NewTxConsumer(nil, recordEffect, onceamqp.Options{URL: b.url, Queue: "q", Scope: "s"})
	require.Error(t, err)
	// Two consumers of one queue on one engine would share a name.
	_, err = onceamqp.NewConsumer(b.engine, writeEffect, onceamqp.Options{URL: b.url, Queue: "q", Scope: "s"})
	require.NoError(t, err)
	_, err = onceamqp.NewConsumer(b.engine, writeEffect, onceamqp.Options{URL: b.url, Queue: "q", Scope: "s"})
	require.Error(t, err)
}
