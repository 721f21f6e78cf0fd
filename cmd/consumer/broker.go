package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/payments"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncenats"
)

// brokerKind is the broker BROKER_URL names.
type brokerKind int

const (
	rabbitMQ brokerKind = iota + 1
	natsJetStream
	kafka
	amazonSQS
)

// The demo's topology on RabbitMQ: durable quorum queue payments.charge,
// which publishers reach through the default exchange with routing key
// payments.charge, with no delivery limit and at-least-once dead-lettering
// (DeclareQueue's defaults) to durable fanout exchange payments.dead, bound
// to durable quorum queue payments.charge.dead.
var demoQueue = onceamqp.Queue{
	Name:               "payments.charge",
	DeadLetterExchange: "payments.dead",
	DeadLetterQueue:    "payments.charge.dead",
}

// handlerName is the name the message handler is registered under, on
// either broker: a payment command is the same whichever broker carried
// it, so a consumer on one broker may finish (Resume) an execution a
// consumer on the other began. The api's handler (payments.HandlerName)
// runs HTTP requests, whose stored request is not a message's.
const handlerName = "payments.message"

// parseBrokerURL checks BROKER_URL and says which broker it names. The
// error is one line and shows no password.
func parseBrokerURL(raw string) (brokerKind, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, errors.New("bad configuration: BROKER_URL is not a URL")
	}
	switch u.Scheme {
	case "amqp", "amqps":
		if _, err := amqp.ParseURI(raw); err != nil {
			return 0, fmt.Errorf("bad configuration: BROKER_URL=%q: %w", u.Redacted(), err)
		}
		return rabbitMQ, nil
	case "nats", "tls":
		if u.Host == "" {
			return 0, fmt.Errorf("bad configuration: BROKER_URL=%q has no host", u.Redacted())
		}
		return natsJetStream, nil
	case "kafka":
		if _, err := kafkaBrokers(raw); err != nil {
			return 0, err
		}
		return kafka, nil
	case "sqs":
		if _, err := parseSQSURL(raw); err != nil {
			return 0, err
		}
		return amazonSQS, nil
	}
	return 0, fmt.Errorf("bad configuration: BROKER_URL=%q: say amqp://user:pass@host:port/vhost (RabbitMQ), nats://host:port (NATS JetStream), kafka://host:port[,host:port…] (Kafka) or sqs://host:port?region=R (SQS)", u.Redacted())
}

// consumer is a broker's consumer as the command runs it.
type consumer interface {
	// Run consumes until ctx ends (see onceamqp and oncenats).
	Run(ctx context.Context) error
	// Connected reports whether it consumes on a live connection.
	Connected() bool
}

// consumerConfig is what a broker's consumer is made of.
type consumerConfig struct {
	url         string
	engine      *onceonly.Engine
	payer       *payments.Payer
	maxFailures int
	workers     int
	lease       time.Duration
	log         *slog.Logger
	registerer  prometheus.Registerer
}

// pay runs one message's payment command: the handler of either broker.
// Its errors fail the key (ErrNotCharged), hand it off to a resumption
// (the charge's outcome is unknown), or are the engine's.
func (c consumerConfig) pay(ctx context.Context, merchant, key string, payload []byte) error {
	_, err := c.payer.Pay(ctx, merchant, key, payload)
	return err
}

func (c consumerConfig) policy() onceonly.SettlePolicy {
	return onceonly.SettlePolicy{MaxFailures: c.maxFailures}
}

// merchantOf and payloadOf read a message's body (ScopeOf and Payload of
// either broker): an error dead-letters it as invalid, with no key row.
func merchantOf(body []byte) (string, error) {
	m, err := payments.ParseMessage(body)
	return m.Merchant, err
}

func payloadOf(body []byte) ([]byte, error) {
	m, err := payments.ParseMessage(body)
	return m.Payload, err
}

// stepBatchSize is the consumers' BatchSize. Every payment steps (its
// charge at the gateway), and a batch refuses a step: the message would run
// in a batch, be refused at its step, roll back and run again alone. One
// message per transaction skips that first run.
const stepBatchSize = 1

// newAMQPConsumer returns the consumer of queue payments.charge. It dials
// on Run, and again whenever the connection is lost.
func newAMQPConsumer(c consumerConfig) (consumer, func(), error) {
	cons, err := onceamqp.NewConsumer(c.engine, func(ctx context.Context, msg onceamqp.Message) error {
		return c.pay(ctx, msg.Scope, msg.Key, msg.Payload)
	}, onceamqp.Options{
		URL:             c.url,
		AMQP:            amqp.Config{Properties: amqp.Table{"connection_name": "onceonly consumer"}},
		Queue:           demoQueue.Name,
		Declare:         func(conn *amqp.Connection) error { return onceamqp.DeclareQueue(conn, demoQueue) },
		ScopeOf:         func(d *amqp.Delivery) (string, error) { return merchantOf(d.Body) },
		Payload:         func(d *amqp.Delivery) ([]byte, error) { return payloadOf(d.Body) },
		Name:            handlerName,
		Workers:         c.workers,
		BatchSize:       stepBatchSize,
		Policy:          c.policy(),
		ShutdownTimeout: shutdownTimeout,
		Logger:          c.log,
		Registerer:      c.registerer,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rabbitmq consumer: %w", err)
	}
	return cons, func() {}, nil
}

// newNATSConsumer connects to NATS (in the background when the server is
// not up yet: nats.go connects and reconnects by itself, forever) and
// returns the consumer of the durable pull consumer payments on stream
// PAYMENTS, and a function that closes the connection.
func newNATSConsumer(c consumerConfig) (consumer, func(), error) {
	nc, err := dialNATS(c.url, "onceonly consumer", c.log)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	topo := oncenats.DemoTopology()
	topo.AckWait = min(topo.AckWait, c.lease) // a dead process's message comes back about when its lease ends
	cons, err := oncenats.NewConsumer(c.engine, func(ctx context.Context, msg oncenats.Message) error {
		return c.pay(ctx, msg.Scope, msg.Key, msg.Payload)
	}, oncenats.Options{
		JetStream:         js,
		Stream:            topo.Stream,
		Consumer:          topo.Consumer,
		Declare:           topo.Declare,
		ScopeOf:           func(msg jetstream.Msg) (string, error) { return merchantOf(msg.Data()) },
		Payload:           func(msg jetstream.Msg) ([]byte, error) { return payloadOf(msg.Data()) },
		DeadLetterSubject: topo.DeadLetterSubject,
		Name:              handlerName,
		Workers:           c.workers,
		BatchSize:         stepBatchSize,
		Policy:            c.policy(),
		LeaseTimeout:      c.lease,
		ShutdownTimeout:   shutdownTimeout,
		Logger:            c.log,
		Registerer:        c.registerer,
	})
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("nats consumer: %w", err)
	}
	return cons, nc.Close, nil
}

// dialNATS connects to the NATS server at url, retrying in the background
// when it is not up yet and reconnecting forever.
func dialNATS(url, name string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats: disconnected; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats: reconnected", "server", nc.ConnectedUrlRedacted()) }))
	if err != nil {
		return nil, fmt.Errorf("connect to nats: %w", err)
	}
	return nc, nil
}
