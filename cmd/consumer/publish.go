package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/onceamqp"
	"github.com/onceonly/onceonly/oncenats"
)

// publishTimeout bounds a whole `consumer publish`.
const publishTimeout = 30 * time.Second

// runPublish is `consumer publish [flags] KEY MESSAGE`: it declares the
// topology (as a consumer does, so a message published first is kept) and
// publishes MESSAGE -copies times, each confirmed by the broker, then
// prints {"published":N} on stdout. It does not validate MESSAGE: the
// consumer dead-letters what is invalid.
func runPublish(args []string, stdout, stderr io.Writer) int {
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") && len(pos) < 2 {
		pos, args = append(pos, args[0]), args[1:]
	}
	set, s := newSet(stderr)
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return fail(stderr, "consumer publish", err, 2)
	}
	if pos = append(pos, set.Args()...); len(pos) != 2 {
		return fail(stderr, "consumer publish", errors.New("say KEY MESSAGE"), 2)
	}
	if err := set.Require(map[string]*string{"broker-url": s.brokerURL}); err != nil {
		return fail(stderr, "consumer publish", err, 2)
	}
	kind, err := parseBrokerURL(*s.brokerURL)
	if err != nil {
		return fail(stderr, "consumer publish", err, 2)
	}
	if *s.copies < 1 {
		return fail(stderr, "consumer publish", errors.New("bad configuration: -copies must be at least 1"), 2)
	}
	ctx, stop := shutdown.SignalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	publish := publishAMQP
	switch kind {
	case natsJetStream:
		publish = publishNATS
	case kafka:
		publish = publishKafka
	case amazonSQS:
		publish = publishSQS
	case rabbitMQ:
	}
	if err := publish(ctx, *s.brokerURL, pos[0], []byte(pos[1]), *s.copies); err != nil {
		return fail(stderr, "consumer publish", err, 1)
	}
	fmt.Fprintf(stdout, "{\"published\":%d}\n", *s.copies)
	return 0
}

// publishAMQP publishes body copies times on the default exchange with
// routing key payments.charge and message-id key, persistent, each
// confirmed by the broker.
func publishAMQP(ctx context.Context, url, key string, body []byte, copies int) error {
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": "onceonly publish"}})
	if err != nil {
		return fmt.Errorf("dial rabbitmq: %w", err)
	}
	defer conn.Close()
	if err := onceamqp.DeclareQueue(conn, demoQueue); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	for range copies {
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", demoQueue.Name, false, false, amqp.Publishing{
			MessageId: key, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		acked, err := conf.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("wait for the confirm: %w", err)
		}
		if !acked {
			return errors.New("the broker refused the message (nack)")
		}
	}
	return nil
}

// publishNATS publishes body copies times on payments.charge with header
// Idempotency-Key, each acknowledged by the stream. It sets no
// Nats-Msg-Id: JetStream would drop the copies at publication, and the
// point is to show the consumer running them once.
func publishNATS(ctx context.Context, url, key string, body []byte, copies int) error {
	nc, err := nats.Connect(url, nats.Name("onceonly publish"))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	topo := oncenats.DemoTopology()
	if _, err := topo.Declare(ctx, js); err != nil {
		return err
	}
	for range copies {
		msg := &nats.Msg{Subject: topo.Subject, Header: nats.Header{oncenats.DefaultKeyHeader: {key}}, Data: body}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}
