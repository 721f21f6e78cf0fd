package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly/oncekafka"
)

// The demo's topology on Kafka: topic payments.charge (kafkaPartitions
// partitions), dead letters on topic payments.charge.dead, consumer group
// payments; created when missing, with the broker's replication factor.
const (
	kafkaTopic      = "payments.charge"
	kafkaDeadTopic  = "payments.charge.dead"
	kafkaGroup      = "payments"
	kafkaPartitions = 3
)

// kafkaBrokers returns the seed brokers of kafka://host:port[,host:port…].
func kafkaBrokers(raw string) ([]string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("bad configuration: BROKER_URL is not a URL")
	}
	if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		// No SASL nor TLS in the demo: a URL that asks for them is refused.
		return nil, fmt.Errorf("bad configuration: BROKER_URL=%q: say kafka://host:port[,host:port…]", u.Redacted())
	}
	return strings.Split(u.Host, ","), nil
}

// declareKafka creates the demo's topics when missing.
func declareKafka(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).CreateTopics(ctx, kafkaPartitions, -1, nil, kafkaTopic, kafkaDeadTopic)
	if err != nil {
		return fmt.Errorf("create the kafka topics: %w", err)
	}
	for _, r := range res {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create kafka topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// kafkaConsumer is oncekafka's consumer, which declares the topology
// before it joins the group (again at each Run, until it succeeds).
type kafkaConsumer struct {
	*oncekafka.Consumer
	brokers []string
}

func (k kafkaConsumer) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if err = declareKafka(ctx, cl); err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	cl.Close()
	if ctx.Err() != nil {
		return nil //nolint:nilerr // stopped while declaring the topics: a clean stop, not a failure
	}
	return k.Consumer.Run(ctx)
}

// Connected is true while the consumer owns partitions of the group.
func (k kafkaConsumer) Connected() bool { return k.Joined() }

// newKafkaConsumer returns the consumer of topic payments.charge in group
// payments; kgo connects on Run, and again whenever the broker is lost.
func newKafkaConsumer(c consumerConfig) (consumer, func(), error) {
	brokers, err := kafkaBrokers(c.url)
	if err != nil {
		return nil, nil, err
	}
	cons, err := oncekafka.NewConsumer(c.engine, func(ctx context.Context, msg oncekafka.Message) error {
		return c.pay(ctx, msg.Scope, msg.Key, msg.Payload)
	}, oncekafka.Options{
		Brokers:         brokers,
		Group:           kafkaGroup,
		Topics:          []string{kafkaTopic},
		ClientOptions:   []kgo.Opt{kgo.SessionTimeout(max(c.lease, 6*time.Second)), kgo.FetchMaxWait(500 * time.Millisecond)},
		ScopeOf:         func(rec *kgo.Record) (string, error) { return merchantOf(rec.Value) },
		Payload:         func(rec *kgo.Record) ([]byte, error) { return payloadOf(rec.Value) },
		DeadLetterTopic: kafkaDeadTopic,
		Name:            handlerName,
		Workers:         c.workers,
		Policy:          c.policy(),
		ShutdownTimeout: shutdownTimeout,
		Logger:          c.log,
		Registerer:      c.registerer,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("kafka consumer: %w", err)
	}
	return kafkaConsumer{cons, brokers}, func() {}, nil
}

// publishKafka produces body copies times to payments.charge with header
// Idempotency-Key (each acknowledged by the broker), after creating the
// topics when missing.
func publishKafka(ctx context.Context, raw, key string, body []byte, copies int) error {
	brokers, err := kafkaBrokers(raw)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	if err := declareKafka(ctx, cl); err != nil {
		return err
	}
	for range copies {
		rec := &kgo.Record{Topic: kafkaTopic, Value: body}
		if key != "" {
			rec.Headers = []kgo.RecordHeader{{Key: oncekafka.DefaultKeyHeader, Value: []byte(key)}}
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}
