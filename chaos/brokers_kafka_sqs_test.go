package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly/oncekafka"
	"github.com/onceonly/onceonly/oncekafka/kafkatest"
	"github.com/onceonly/onceonly/oncesqs"
	"github.com/onceonly/onceonly/oncesqs/sqstest"
)

// The demo consumer's topology on Kafka and SQS (docs/consumer.md#kafka-and-sqs).
const (
	kafkaTopic     = "payments.charge"
	kafkaDeadTopic = "payments.charge.dead"
	kafkaGroup     = "payments"
	sqsQueue       = "payments-charge"
	sqsDeadQueue   = "payments-charge-dead"
)

// kafkaChaos is a private kfake process (kafkatest) keeping its records
// and offsets in a data directory, so its restart is a real one. Its
// dead letters move at least once: a consumer killed between producing a
// dead letter and committing past the record produces it again.
type kafkaChaos struct {
	br *kafkatest.Broker

	mu sync.Mutex
	cl *kgo.Client // the publishers', replaced after an error
}

func newKafkaChaos(t *testing.T) *kafkaChaos {
	bin, err := kafkatest.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &kafkaChaos{br: &kafkatest.Broker{Bin: bin, DataDir: t.TempDir()}}
	if err := b.br.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.br.Stop)
	return b
}

func (b *kafkaChaos) url() string { return "kafka://" + b.br.Addr }

func (b *kafkaChaos) restart() {
	b.br.Stop()
	if err := b.br.Start(); err != nil {
		panic(fmt.Sprintf("restart kfake: %v", err))
	}
}

func (b *kafkaChaos) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cl != nil {
		b.cl.Close()
		b.cl = nil
	}
}

// client returns the publishers' client (idempotent writes: a retry
// inside the client adds no copy).
func (b *kafkaChaos) client() (*kgo.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cl == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.br.Addr), kgo.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("kafka client: %w", err)
		}
		b.cl = cl
	}
	return b.cl, nil
}

// drop replaces cl by a new client at the next call, unless it was
// replaced already.
func (b *kafkaChaos) drop(cl *kgo.Client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cl == cl {
		b.cl = nil
		go cl.Close() // its records in flight fail: their outcome stays unknown
	}
}

func (b *kafkaChaos) publish(ctx context.Context, key, body string) error {
	cl, err := b.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: kafkaTopic, Value: []byte(body)}
	if key != "" {
		rec.Headers = []kgo.RecordHeader{{Key: oncekafka.DefaultKeyHeader, Value: []byte(key)}}
	}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		b.drop(cl)
		return fmt.Errorf("produce: %w", err)
	}
	return nil
}

// deadLetters reads payments.charge.dead from its start to its end.
func (b *kafkaChaos) deadLetters(ctx context.Context, _ string) ([]deadLetter, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.br.Addr), kgo.ConsumeTopics(kafkaDeadTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, kafkaDeadTopic)
	if err != nil {
		return nil, fmt.Errorf("the dead-letter topic's end: %w", err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	var out []deadLetter
	for int64(len(out)) < total {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		fetches := cl.PollFetches(pctx)
		timedOut := pctx.Err() != nil
		cancel()
		if timedOut {
			return nil, fmt.Errorf("read %d of the dead-letter topic's %d records", len(out), total)
		}
		for _, rec := range fetches.Records() {
			out = append(out, deadLetter{key: kafkatest.Header(rec, oncekafka.DefaultKeyHeader), reason: kafkatest.Header(rec, oncekafka.HeaderReason), body: string(rec.Value)})
		}
	}
	return out, nil
}

// pending is how many records of payments.charge the group has not
// committed past.
func (b *kafkaChaos) pending(ctx context.Context) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.br.Addr))
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	return kafkatest.Lag(ctx, kadm.NewClient(cl), kafkaGroup, kafkaTopic)
}

// sqsChaos is a private goaws behind its JSON front (sqstest). goaws keeps
// nothing across a restart, and SQS does not restart as a whole, so its
// restart is an outage of the endpoint: the front closed, every connection
// dropped, then served again on the same address. Its dead letters move
// at least once (a consumer killed between sending one and deleting the
// message sends it again), and reading them deletes them: they are kept
// here.
type sqsChaos struct {
	srv *sqstest.Server
	cl  *sqs.Client

	mu          sync.Mutex
	queue, dead string // the queues' URLs, once known
	taken       []deadLetter
}

func newSQSChaos(t *testing.T) *sqsChaos {
	srv, err := sqstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &sqsChaos{srv: srv, cl: sqstest.Client(srv.Endpoint)}
}

func (b *sqsChaos) url() string { return "sqs://" + strings.TrimPrefix(b.srv.Endpoint, "http://") }
func (b *sqsChaos) close()      {}

func (b *sqsChaos) restart() {
	if err := b.srv.RestartFront(); err != nil {
		panic(fmt.Sprintf("restart the SQS front: %v", err))
	}
}

// queueURL returns the URL of queue name (which the consumers create).
func (b *sqsChaos) queueURL(ctx context.Context, name string) (string, error) {
	b.mu.Lock()
	known := map[string]string{sqsQueue: b.queue, sqsDeadQueue: b.dead}[name]
	b.mu.Unlock()
	if known != "" {
		return known, nil
	}
	out, err := b.cl.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("the URL of %s: %w", name, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if name == sqsQueue {
		b.queue = aws.ToString(out.QueueUrl)
	} else {
		b.dead = aws.ToString(out.QueueUrl)
	}
	return aws.ToString(out.QueueUrl), nil
}

func (b *sqsChaos) publish(ctx context.Context, key, body string) error {
	u, err := b.queueURL(ctx, sqsQueue)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	in := &sqs.SendMessageInput{QueueUrl: aws.String(u), MessageBody: aws.String(body)}
	if key != "" {
		in.MessageAttributes = map[string]types.MessageAttributeValue{
			oncesqs.DefaultKeyAttribute: {DataType: aws.String("String"), StringValue: aws.String(key)}}
	}
	if _, err := b.cl.SendMessage(ctx, in); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// deadLetters takes what payments-charge-dead holds and returns every dead
// letter taken so far.
func (b *sqsChaos) deadLetters(ctx context.Context, _ string) ([]deadLetter, error) {
	u, err := b.queueURL(ctx, sqsDeadQueue)
	if err != nil {
		return nil, err
	}
	for {
		out, err := b.cl.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(u), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}})
		if err != nil {
			return nil, fmt.Errorf("receive the dead letters: %w", err)
		}
		if len(out.Messages) == 0 {
			b.mu.Lock()
			defer b.mu.Unlock()
			return append([]deadLetter(nil), b.taken...), nil
		}
		for _, m := range out.Messages {
			if _, err := b.cl.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(u), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return nil, fmt.Errorf("delete a dead letter: %w", err)
			}
			b.mu.Lock()
			b.taken = append(b.taken, deadLetter{key: sqstest.Attr(m, oncesqs.DefaultKeyAttribute), reason: sqstest.Attr(m, oncesqs.AttributeReason),
				body: aws.ToString(m.Body)})
			b.mu.Unlock()
		}
	}
}

// pending is how many messages payments-charge holds, visible or not.
func (b *sqsChaos) pending(ctx context.Context) (int, error) {
	u, err := b.queueURL(ctx, sqsQueue)
	if err != nil {
		return 0, err
	}
	return sqstest.Depth(ctx, b.cl, u)
}
