package oncesqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncesqs"
	"github.com/onceonly/onceonly/oncesqs/sqstest"
	"github.com/onceonly/onceonly/oncetest"
)

func TestCopiesRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.run(t, effect, b.options())

	// Three copies of one message, sent at once, and a message of another key.
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
	require.Positive(t, b.deleteBatches(t), "deletes go through DeleteMessageBatch")
}

func TestTxConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c, err := oncesqs.NewTxConsumer(b.engine, func(ctx context.Context, tx pgx.Tx, msg oncesqs.Message) error {
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
	require.Equal(t, `{"amount":999}`, *dead.Body)
	require.Equal(t, "order-1", attr(dead, oncesqs.DefaultKeyAttribute))
	require.Equal(t, "t-1", attr(dead, "Trace"), "the original attributes go along")
	require.Equal(t, onceonly.ReasonReused, attr(dead, oncesqs.AttributeReason))
	require.NotEmpty(t, attr(dead, oncesqs.AttributeError))
	b.awaitSettled(t, 10*time.Second) // deleted from the queue
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "dead_letter", onceonly.ReasonReused))
}

func TestInvalidMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opts := b.options()
	opts.Payload = func(msg *types.Message) ([]byte, error) {
		if *msg.Body == "panic" {
			panic("a decoder bug")
		}
		var order struct {
			Amount int `json:"amount"`
		}
		if err := json.Unmarshal([]byte(*msg.Body), &order); err != nil {
			return nil, fmt.Errorf("an order is JSON: %w", err)
		}
		if order.Amount < 1 {
			return nil, fmt.Errorf("%w: an order needs a positive amount", onceonly.ErrInvalidMessage)
		}
		return []byte(*msg.Body), nil
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
		require.Equal(t, onceonly.ReasonInvalid, attr(msg, oncesqs.AttributeReason), attr(msg, oncesqs.AttributeError))
	}
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.keyRows(t), "an invalid message leaves no key")
	require.Equal(t, 1, b.rows(t, "order-4"))
	require.Equal(t, 5, b.count(t, "dead_letter", onceonly.ReasonInvalid))
}

// A key that fails MaxFailures times is dead-lettered; a later copy of it
// runs again, and succeeds.
func TestRepeatedFailureIsDeadLetteredThenRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var calls atomic.Int32
	opts := b.options()
	opts.Policy.MaxFailures = 2
	b.run(t, func(ctx context.Context, msg oncesqs.Message) error {
		n := calls.Add(1)
		if err := effect(ctx, msg); err != nil {
			return err
		}
		switch n {
		case 1:
			return errors.New("the gateway declined to answer")
		case 2:
			panic("a handler bug") // a failure too, and the process lives on
		}
		return nil
	}, opts)

	b.publish(t, "order-1", `{"amount":100}`)
	dead := b.awaitDeadLetters(t, 1)[0]
	require.Equal(t, onceonly.ReasonFailed, attr(dead, oncesqs.AttributeReason))
	require.Contains(t, attr(dead, oncesqs.AttributeError), "handler panicked")
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, int32(2), calls.Load(), "dead-lettered after MaxFailures executions")
	require.Zero(t, b.rows(t, "order-1"), "a failed execution's writes are rolled back")
	require.Equal(t, 1, b.count(t, "retry", "failed"))

	b.publish(t, "order-1", `{"amount":100}`) // sent again, after the fix
	b.awaitSettled(t, 10*time.Second)
	oncetest.Eventually(t, 10*time.Second, "the later copy executed", func() bool { return b.count(t, "ack", "executed") == 1 })
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Len(t, b.deadLetters(t), 1)
}

// A copy whose key is in flight comes back again and again while the
// first runs, and is never dead-lettered: not by the consumer (in flight
// is no failure), and not by SQS (the queue has no redrive policy).
func TestCopyOfKeyInFlightIsNeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	held := effectAfter(release)
	opts := b.options()
	opts.Policy.MaxFailures = 1
	b.run(t, func(ctx context.Context, msg oncesqs.Message) error {
		once.Do(func() { close(started) })
		return held(ctx, msg)
	}, opts)

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	b.publish(t, "order-1", `{"amount":100}`) // a copy while the first runs
	oncetest.Eventually(t, 20*time.Second, "the copy turned away while the key is in flight, more than MaxFailures times", func() bool {
		return b.count(t, "retry", "in_flight") >= 3
	})
	require.Zero(t, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t))
	close(release)

	b.awaitSettled(t, 15*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 1, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t), "a key in flight is never dead-lettered")
}

// An execution that outlives its message's visibility timeout keeps the
// message hidden (the heartbeat): it is never received twice, and its
// effect happens once.
func TestHeartbeatKeepsALongExecutionsMessage(t *testing.T) {
	t.Parallel()
	const visibility = 2 * time.Second
	b := setup(t, setupOpts{visibility: int(visibility / time.Second)})
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	b.run(t, func(ctx context.Context, msg oncesqs.Message) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		return effectAfter(release)(ctx, msg)
	}, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	// The execution runs three visibility timeouts (and a lease's worth
	// more); without the heartbeat goaws would make the message visible
	// again after the first, and the consumer would receive it again.
	deadline := time.After(3*visibility + leaseTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-deadline:
			break wait
		case <-tick.C:
			require.Zero(t, b.count(t, "retry", "in_flight"), "the message was received again while its execution ran")
		}
	}
	close(release)
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 1, b.rows(t, "order-1"), "no double effect")
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Zero(t, b.count(t, "ack", "replayed"))
	require.Zero(t, b.count(t, "retry", "in_flight"))
}

// Stop lets the execution under way finish and delete its message.
func TestShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	held := effectAfter(release)
	c, err := oncesqs.NewConsumer(b.engine, func(ctx context.Context, msg oncesqs.Message) error {
		once.Do(func() { close(started) })
		return held(ctx, msg)
	}, b.options())
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	<-c.Started()

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while an execution ran")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the execution ended")
	}
	require.False(t, c.Connected())
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Zero(t, b.queued(t, b.queue), "the message was deleted before Stop returned")
	require.Equal(t, 1, b.settlements(onceonly.Ack))
}

// Past ShutdownTimeout the execution is canceled, and its message stays in
// the queue for a later consumer.
func TestShutdownBound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opts := b.options()
	opts.ShutdownTimeout = 300 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	held := effectAfter(make(chan struct{})) // never released, at first
	c, err := oncesqs.NewConsumer(b.engine, func(ctx context.Context, msg oncesqs.Message) error {
		once.Do(func() { close(started) })
		mu.Lock()
		run := held
		mu.Unlock()
		return run(ctx, msg)
	}, opts)
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	begin := time.Now()
	c.Stop()
	require.Less(t, time.Since(begin), 5*time.Second)
	require.Equal(t, 1, b.queued(t, b.queue), "the canceled execution's message stays")
	require.Zero(t, b.rows(t, "order-1"))

	// Started again, the consumer finishes it (the handler now lets go).
	once2 := make(chan struct{})
	close(once2)
	mu.Lock()
	held = effectAfter(once2)
	mu.Unlock()
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(c.Stop)
	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
}

func TestNewConsumerChecksOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for what, broken := range map[string]func(o *oncesqs.Options){
		"client":     func(o *oncesqs.Options) { o.Client = nil },
		"queue":      func(o *oncesqs.Options) { o.QueueURL = "" },
		"scope":      func(o *oncesqs.Options) { o.Scope = "" },
		"bad scope":  func(o *oncesqs.Options) { o.Scope = "a:b" },
		"wait":       func(o *oncesqs.Options) { o.WaitTime = 21 * time.Second },
		"negative":   func(o *oncesqs.Options) { o.Workers = -1 },
		"fifo mix":   func(o *oncesqs.Options) { o.DeadLetterQueueURL += ".fifo" },
		"visibility": func(o *oncesqs.Options) { o.VisibilityTimeout = 13 * time.Hour },
	} {
		opts := b.options()
		broken(&opts)
		_, err := oncesqs.NewConsumer(b.engine, effect, opts)
		require.Error(t, err, what)
	}
	_, err := oncesqs.NewConsumer(b.engine, nil, b.options())
	require.Error(t, err)
}

// Why the consumer dead-letters by itself: a redrive policy counts
// receives, and moves a copy whose key is merely in flight elsewhere to
// the dead-letter queue, with no reason, while the first execution is
// about to succeed. (goaws counts a receive when a visibility timeout runs
// out, as SQS counts the next receive.)
func TestRedrivePolicyWouldDeadLetterACopyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.client.SetQueueAttributes(b.ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(b.queue), Attributes: map[string]string{
		"RedrivePolicy": `{"maxReceiveCount":"2","deadLetterTargetArn":"arn:aws:sqs:local:queue:` + queueNameOf(b.dlq) + `"}`,
	}})
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	held := effectAfter(release)
	b.run(t, func(ctx context.Context, msg oncesqs.Message) error {
		once.Do(func() { close(started) })
		return held(ctx, msg)
	}, b.options())

	b.publish(t, "order-1", `{"amount":100}`)
	<-started
	b.publish(t, "order-1", `{"amount":100}`) // a copy while the first runs
	dead := b.awaitDeadLetters(t, 1)[0]
	require.Empty(t, attr(dead, oncesqs.AttributeReason), "SQS's redrive gives no reason")
	require.Zero(t, b.count(t, "dead_letter", onceonly.ReasonFailed), "the consumer dead-lettered nothing")
	close(release)
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
}

// A dead letter keeps every original attribute; Onceonly-Reason and
// Onceonly-Error take what room SQS's 10 attributes leave.
func TestDeadLetterAttributesWithinTen(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.run(t, effect, b.options())
	send := func(n int) {
		attrs := map[string]types.MessageAttributeValue{}
		for i := range n {
			attrs["A"+strconv.Itoa(i)] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(strconv.Itoa(n))}
		}
		_, err := b.client.SendMessage(b.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(b.queue), MessageBody: aws.String(strconv.Itoa(n)), MessageAttributes: attrs})
		require.NoError(t, err) // no Idempotency-Key: invalid
	}
	send(8)
	send(9)
	send(10)
	for _, dead := range b.awaitDeadLetters(t, 3) {
		n, err := strconv.Atoi(*dead.Body)
		require.NoError(t, err)
		for i := range n {
			require.Equal(t, *dead.Body, attr(dead, "A"+strconv.Itoa(i)), "original attribute kept")
		}
		switch n {
		case 8:
			require.Equal(t, onceonly.ReasonInvalid, attr(dead, oncesqs.AttributeReason))
			require.NotEmpty(t, attr(dead, oncesqs.AttributeError))
		case 9:
			require.Equal(t, onceonly.ReasonInvalid, attr(dead, oncesqs.AttributeReason))
			require.NotContains(t, dead.MessageAttributes, oncesqs.AttributeError)
		case 10:
			require.Len(t, dead.MessageAttributes, 10)
		}
	}
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 3, b.count(t, "dead_letter", onceonly.ReasonInvalid))
}

// A queue that does not exist (yet): Run keeps trying, reports itself not
// connected, and stops at once.
func TestMissingQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opts := b.options()
	opts.QueueURL = b.queue + "-missing"
	c, err := oncesqs.NewConsumer(b.engine, effect, opts)
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	oncetest.Eventually(t, 10*time.Second, "failed attempts counted", func() bool {
		return oncetest.Metric(t, b.reg, "onceonly_sqs_settle_errors_total", map[string]string{"op": "attributes"}) >= 2
	})
	require.False(t, c.Connected())
	begin := time.Now()
	c.Stop()
	require.Less(t, time.Since(begin), 2*time.Second)
}

func queueNameOf(url string) string { return url[strings.LastIndex(url, "/")+1:] }

// stallingClient is SQS whose first receive waits for the consumer to
// stop, then receives anyway: messages that arrive while the consumer
// stops.
type stallingClient struct {
	*sqs.Client
	polling chan struct{}
	once    sync.Once
}

func (s *stallingClient) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.Client.ReceiveMessage(ctx, in, opts...)
	}
	close(s.polling)
	<-ctx.Done()
	return s.Client.ReceiveMessage(context.WithoutCancel(ctx), in, opts...)
}

// Messages received while the consumer stops are made visible again at
// once, unstarted (not after the queue's 10 s visibility timeout).
func TestStopHandsBackWhatItReceived(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.publish(t, "order-1", `{"amount":100}`)
	opts := b.options()
	sc := &stallingClient{Client: b.client, polling: make(chan struct{})}
	opts.Client = sc
	var runs atomic.Int32
	c, err := oncesqs.NewConsumer(b.engine, func(ctx context.Context, msg oncesqs.Message) error {
		runs.Add(1)
		return effect(ctx, msg)
	}, opts)
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	<-sc.polling
	c.Stop()
	require.Zero(t, runs.Load())
	require.Equal(t, 1, b.count(t, "retry", "shutdown"))
	out, err := b.client.ReceiveMessage(b.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(b.queue), WaitTimeSeconds: 2})
	require.NoError(t, err)
	require.Len(t, out.Messages, 1, "visible again at once")
}

// A FIFO queue: copies with deduplication IDs of their own (sent apart,
// or past SQS's five minutes) run once; a reused key goes to the FIFO
// dead-letter queue.
func TestFIFOQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sfx := oncetest.RandomSuffix(10)
	var err error
	b.dlq, err = sqstest.CreateQueue(b.ctx, b.client, "dead-"+sfx+".fifo", nil)
	require.NoError(t, err)
	b.queue, err = sqstest.CreateQueue(b.ctx, b.client, "q-"+sfx+".fifo", map[string]string{"VisibilityTimeout": "10"})
	require.NoError(t, err)
	opts := b.options()
	// One message a receive: goaws 0.4.5 hides the other messages of a
	// locked group that a multi-message receive walks past, for a whole
	// visibility timeout (SQS does not).
	opts.Workers = 1
	b.run(t, effect, opts)

	for i, body := range []string{`{"amount":100}`, `{"amount":100}`, `{"amount":999}`} {
		_, err := b.client.SendMessage(b.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(b.queue), MessageBody: aws.String(body),
			MessageGroupId: aws.String("merchant-1"), MessageDeduplicationId: aws.String("send-" + strconv.Itoa(i)),
			MessageAttributes: map[string]types.MessageAttributeValue{
				oncesqs.DefaultKeyAttribute: {DataType: aws.String("String"), StringValue: aws.String("order-1")},
			}})
		require.NoError(t, err)
	}
	dead := b.awaitDeadLetters(t, 1)[0]
	require.Equal(t, `{"amount":999}`, *dead.Body)
	require.Equal(t, onceonly.ReasonReused, attr(dead, oncesqs.AttributeReason))
	b.awaitSettled(t, 15*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 1, b.count(t, "ack", "replayed"))
}

// A dead letter that cannot be sent leaves its message in the queue, to
// be dead-lettered when it comes back: never lost.
func TestDeadLetterSendFailsMessageStays(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opts := b.options()
	opts.DeadLetterQueueURL = b.dlq + "-missing"
	b.run(t, effect, opts)
	b.publish(t, "", `{"amount":100}`) // no key: invalid
	oncetest.Eventually(t, 10*time.Second, "the dead letter's send failed, twice", func() bool {
		return b.count(t, "retry", "dead_letter_failed") >= 2
	})
	require.Equal(t, 1, b.queued(t, b.queue), "the message stays")
	require.Zero(t, b.count(t, "dead_letter", onceonly.ReasonInvalid))
}

// lossyClient is SQS whose first DeleteMessageBatch is lost after SQS did
// nothing: the delete never happened.
type lossyClient struct {
	*sqs.Client
	once sync.Once
}

func (l *lossyClient) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	lost := false
	l.once.Do(func() { lost = true })
	if lost {
		return nil, errors.New("connection reset by peer")
	}
	return l.Client.DeleteMessageBatch(ctx, in, opts...)
}

// A lost delete brings the message back after its visibility timeout,
// and it is deleted then as a replay: one effect.
func TestLostDeleteIsAReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{visibility: 1})
	opts := b.options()
	opts.Client = &lossyClient{Client: b.client}
	b.run(t, effect, opts)
	b.publish(t, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 15*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 1, b.count(t, "ack", "replayed"))
	require.Equal(t, 1, int(oncetest.Metric(t, b.reg, "onceonly_sqs_settle_errors_total", map[string]string{"op": "delete"})))
}
