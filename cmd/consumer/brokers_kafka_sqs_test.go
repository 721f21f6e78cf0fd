package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly/oncekafka"
	"github.com/onceonly/onceonly/oncekafka/kafkatest"
	"github.com/onceonly/onceonly/oncesqs"
	"github.com/onceonly/onceonly/oncesqs/sqstest"
	"github.com/onceonly/onceonly/oncetest"
)

// kafkaBroker is a kfake process of the test's (kafkatest): reset starts
// a fresh one, so each subtest has the topics and the group to itself.
type kafkaBroker struct {
	bin string
	br  *kafkatest.Broker
}

func newKafkaBroker(t *testing.T) *kafkaBroker {
	t.Helper()
	bin, err := kafkatest.Build(t.TempDir())
	require.NoError(t, err)
	return &kafkaBroker{bin: bin}
}

func (b *kafkaBroker) name() string { return "kafka" }
func (b *kafkaBroker) url() string  { return "kafka://" + b.br.Addr }

func (b *kafkaBroker) reset(t *testing.T) {
	t.Helper()
	if b.br != nil {
		b.br.Stop()
	}
	b.br = &kafkatest.Broker{Bin: b.bin, DataDir: t.TempDir()}
	require.NoError(t, b.br.Start())
	br := b.br
	t.Cleanup(br.Stop)
}

func (b *kafkaBroker) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.br.Addr)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func (b *kafkaBroker) publish(t *testing.T, key, body string) {
	t.Helper()
	require.NoError(t, publishKafka(oncetest.Context(t), b.url(), key, []byte(body), 1))
}

func (b *kafkaBroker) deadLetters(t *testing.T, _ string) []deadLetter {
	t.Helper()
	cl := b.client(t, kgo.ConsumeTopics(kafkaDeadTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(oncetest.Context(t), kafkaDeadTopic)
	require.NoError(t, err)
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	var out []deadLetter
	for int64(len(out)) < total {
		ctx, cancel := context.WithTimeout(oncetest.Context(t), 5*time.Second)
		fetches := cl.PollFetches(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		require.False(t, timedOut, "the dead-letter topic's %d records", total)
		for _, rec := range fetches.Records() {
			out = append(out, deadLetter{key: kafkatest.Header(rec, oncekafka.DefaultKeyHeader), reason: kafkatest.Header(rec, oncekafka.HeaderReason)})
		}
	}
	return out
}

// left is how many records of payments.charge the group has not
// committed past.
func (b *kafkaBroker) left(t *testing.T) int {
	t.Helper()
	ctx := oncetest.Context(t)
	n, err := kafkatest.Lag(ctx, kadm.NewClient(b.client(t)), kafkaGroup, kafkaTopic)
	if err != nil {
		require.NoError(t, ctx.Err())
		t.Logf("payments.charge's lag: %v", err)
		return -1 // not known: not zero
	}
	return n
}

func (b *kafkaBroker) metric() string { return "onceonly_kafka_records_total" }

func (b *kafkaBroker) dropConnections(t *testing.T) {
	t.Helper()
	b.br.Kill()
	require.NoError(t, b.br.Start())
}

// sqsBroker is goaws behind its JSON front (sqstest): reset starts a
// fresh one (the front has no DeleteQueue), so each subtest has the queues
// to itself.
type sqsBroker struct {
	srv  *sqstest.Server
	cl   *sqs.Client
	dead []deadLetter // received off payments-charge-dead (and deleted) so far
}

func newSQSBroker(*testing.T) *sqsBroker { return &sqsBroker{} }

func (b *sqsBroker) name() string { return "sqs" }
func (b *sqsBroker) url() string  { return "sqs://" + strings.TrimPrefix(b.srv.Endpoint, "http://") }

func (b *sqsBroker) queueURL(t *testing.T, name string) (string, bool) {
	t.Helper()
	out, err := b.cl.GetQueueUrl(oncetest.Context(t), &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		return "", false
	}
	return aws.ToString(out.QueueUrl), true
}

func (b *sqsBroker) reset(t *testing.T) {
	t.Helper()
	b.dead = nil
	if b.srv != nil {
		b.srv.Close()
	}
	srv, err := sqstest.Start()
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	b.srv, b.cl = srv, sqstest.Client(srv.Endpoint)
}

func (b *sqsBroker) publish(t *testing.T, key, body string) {
	t.Helper()
	require.NoError(t, publishSQS(oncetest.Context(t), b.url(), key, []byte(body), 1))
}

func (b *sqsBroker) deadLetters(t *testing.T, _ string) []deadLetter {
	t.Helper()
	u, ok := b.queueURL(t, sqsDeadQueue)
	if !ok {
		return b.dead
	}
	for {
		out, err := b.cl.ReceiveMessage(oncetest.Context(t), &sqs.ReceiveMessageInput{QueueUrl: aws.String(u), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			return b.dead
		}
		for _, m := range out.Messages {
			b.dead = append(b.dead, deadLetter{key: sqstest.Attr(m, oncesqs.DefaultKeyAttribute), reason: sqstest.Attr(m, oncesqs.AttributeReason)})
			_, err := b.cl.DeleteMessage(oncetest.Context(t), &sqs.DeleteMessageInput{QueueUrl: aws.String(u), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
}

// left is how many messages payments-charge holds, visible or not.
func (b *sqsBroker) left(t *testing.T) int {
	t.Helper()
	u, ok := b.queueURL(t, sqsQueue)
	require.True(t, ok)
	n, err := sqstest.Depth(oncetest.Context(t), b.cl, u)
	require.NoError(t, err)
	return n
}

func (b *sqsBroker) metric() string { return "onceonly_sqs_messages_total" }

func (b *sqsBroker) dropConnections(t *testing.T) {
	t.Skip("SQS is HTTP: there is no connection to drop")
}

// TestConsumerKafkaSQS runs the consumer binary on a kfake process
// (kafkatest) and on goaws (sqstest) through the outcomes TestConsumer
// checks on NATS and RabbitMQ, the brokers side by side as there.
func TestConsumerKafkaSQS(t *testing.T) {
	t.Parallel()
	bin := oncetest.BuildBinary(t, ".")
	for _, mk := range []func(*testing.T) testBroker{
		func(t *testing.T) testBroker { return newKafkaBroker(t) },
		func(t *testing.T) testBroker { return newSQSBroker(t) },
	} {
		b := mk(t)
		t.Run(b.name(), func(t *testing.T) {
			t.Parallel()
			t.Run("Outcomes", func(t *testing.T) { testOutcomes(t, bin, b) })
			t.Run("FailedThenDeadLettered", func(t *testing.T) { testFailed(t, bin, b) })
			t.Run("InFlightCopy", func(t *testing.T) { testInFlight(t, bin, b) })
			t.Run("GracefulShutdown", func(t *testing.T) { testShutdown(t, bin, b) })
		})
	}
}
