package oncesqs_test

import (
	"context"
	"maps"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncesqs"
	"github.com/onceonly/onceonly/oncesqs/sqstest"
	"github.com/onceonly/onceonly/oncetest"
)

// endpoint is the SQS endpoint of the package's tests: goaws behind the
// JSON front, one process for the whole run (each test its own queues).
var endpoint string

// TestMain starts goaws, fails the package's tests when a goroutine
// outlives them, and gives the runnable example DATABASE_URL, REDIS_URL and
// SQS_ENDPOINT.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withSQS{oncetest.WithExampleEnv(m, "oncesqs")})
}

type withSQS struct{ m oncetest.TestingM }

func (w withSQS) Run() int {
	s, err := sqstest.Start()
	if err != nil {
		_, _ = os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	endpoint = s.Endpoint
	_ = os.Setenv("SQS_ENDPOINT", s.Endpoint)
	code := w.m.Run()
	s.Close()
	if tr, ok := http.DefaultTransport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
	return code
}

// leaseTimeout is the engine's lease in these tests.
const leaseTimeout = 2 * time.Second

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
	client *sqs.Client
	queue  string // the queue's URL
	dlq    string // the dead-letter queue's URL
	reg    *prometheus.Registry

	mu      sync.Mutex
	settled []onceonly.Settlement // every settlement of the consumers options() made
	dead    []types.Message       // the dead letters received so far
}

// setupOpts vary setup.
type setupOpts struct {
	visibility int               // the queue's VisibilityTimeout in seconds; default 10
	attributes map[string]string // more queue attributes
}

// setup gives a test a database with an effects table, an engine on it
// and the test Redis, and a queue and a dead-letter queue of its own.
func setup(t testing.TB, opts setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), reg: prometheus.NewRegistry()}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (scope text NOT NULL, key text NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	rdb, prefix := oncetest.Redis(t)
	b.engine, err = onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: leaseTimeout,
		ResumeInterval: 100 * time.Millisecond, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)

	b.client = sqstest.Client(endpoint)
	sfx := oncetest.RandomSuffix(10)
	b.dlq, err = sqstest.CreateQueue(b.ctx, b.client, "dead-"+sfx, nil)
	require.NoError(t, err)
	if opts.visibility == 0 {
		opts.visibility = 10
	}
	attrs := map[string]string{"VisibilityTimeout": strconv.Itoa(opts.visibility)}
	maps.Copy(attrs, opts.attributes)
	b.queue, err = sqstest.CreateQueue(b.ctx, b.client, "q-"+sfx, attrs)
	require.NoError(t, err)
	return b
}

// options returns consumer options on the bundle's queues.
func (b *testBundle) options() oncesqs.Options {
	return oncesqs.Options{
		Client:             b.client,
		QueueURL:           b.queue,
		DeadLetterQueueURL: b.dlq,
		Scope:              "tenant",
		Policy:             onceonly.SettlePolicy{MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Workers:            4,
		WaitTime:           time.Second, // goaws polls in steps; keep it short
		LeaseTimeout:       leaseTimeout,
		Logger:             oncetest.QuietLogger(),
		Registerer:         b.reg,
		Settled: func(_ *types.Message, s onceonly.Settlement) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.settled = append(b.settled, s)
		},
	}
}

// settlements returns how many settlements had disposition d.
func (b *testBundle) settlements(d onceonly.Disposition) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, s := range b.settled {
		if s.Disposition == d {
			n++
		}
	}
	return n
}

// run creates a consumer running fn with opts and runs it until the test
// ends; the test fails if Run returns an error.
func (b *testBundle) run(t testing.TB, fn oncesqs.Handler, opts oncesqs.Options) {
	t.Helper()
	c, err := oncesqs.NewConsumer(b.engine, fn, opts)
	require.NoError(t, err)
	b.runConsumer(t, c)
}

// runConsumer runs c until the test ends; the test fails if Run returns an
// error or does not return within 15 s of its context's end.
func (b *testBundle) runConsumer(t testing.TB, c *oncesqs.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of its context's end")
		}
	})
}

// publish sends body with the key in the Idempotency-Key attribute (none
// when key is "").
func (b *testBundle) publish(t testing.TB, key, body string) {
	t.Helper()
	in := &sqs.SendMessageInput{QueueUrl: aws.String(b.queue), MessageBody: aws.String(body), MessageAttributes: map[string]types.MessageAttributeValue{
		"Trace": {DataType: aws.String("String"), StringValue: aws.String("t-1")},
	}}
	if key != "" {
		in.MessageAttributes[oncesqs.DefaultKeyAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(key)}
	}
	_, err := b.client.SendMessage(b.ctx, in)
	require.NoError(t, err)
}

// effect is a handler that writes one effects row through the execution's
// transaction.
func effect(ctx context.Context, msg oncesqs.Message) error {
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`, msg.Scope, msg.Key, string(msg.Payload))
	return err
}

// effectAfter returns a handler that waits until release is closed (or
// its context ends), then writes the effect.
func effectAfter(release <-chan struct{}) oncesqs.Handler {
	return func(ctx context.Context, msg oncesqs.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, msg)
	}
}

// rows counts the effects rows of key.
func (b *testBundle) rows(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n))
	return n
}

// keyRows counts the idempotency_keys rows of the test's database.
func (b *testBundle) keyRows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n))
	return n
}

// queued returns how many messages the queue holds, visible or not.
func (b *testBundle) queued(t testing.TB, queue string) int {
	t.Helper()
	out, err := b.client.GetQueueAttributes(b.ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	require.NoError(t, err)
	n, err := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	require.NoError(t, err)
	return n
}

// awaitSettled waits until the queue is empty: every message published
// was deleted.
func (b *testBundle) awaitSettled(t testing.TB, timeout time.Duration) {
	t.Helper()
	oncetest.Eventually(t, timeout, "every message settled", func() bool { return b.queued(t, b.queue) == 0 })
}

// deadLetters receives what reached the dead-letter queue and returns
// every dead letter received so far.
func (b *testBundle) deadLetters(t testing.TB) []types.Message {
	t.Helper()
	for {
		out, err := b.client.ReceiveMessage(b.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(b.dlq), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			break
		}
		b.mu.Lock()
		b.dead = append(b.dead, out.Messages...)
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]types.Message(nil), b.dead...)
}

// awaitDeadLetters waits until n dead letters arrived and returns them.
func (b *testBundle) awaitDeadLetters(t testing.TB, n int) []types.Message {
	t.Helper()
	var msgs []types.Message
	oncetest.Eventually(t, 15*time.Second, "dead letters", func() bool {
		msgs = b.deadLetters(t)
		return len(msgs) >= n
	})
	require.Len(t, msgs, n)
	return msgs
}

// count reads onceonly_sqs_messages_total{disposition, reason}.
func (b *testBundle) count(t testing.TB, disposition, reason string) int {
	t.Helper()
	return int(oncetest.Metric(t, b.reg, "onceonly_sqs_messages_total", map[string]string{"disposition": disposition, "reason": reason}))
}

// attr is a dead letter's String attribute.
func attr(m types.Message, name string) string {
	return aws.ToString(m.MessageAttributes[name].StringValue)
}

// deleteBatches returns how many DeleteMessageBatch calls were made.
func (b *testBundle) deleteBatches(t testing.TB) uint64 {
	t.Helper()
	families, err := b.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "onceonly_sqs_delete_batch_size" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}
