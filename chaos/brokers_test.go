package chaos

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly/oncetest"
)

// The demo consumer's topology (docs/consumers.md), as publishers and
// operators see it.
const (
	natsStream       = "PAYMENTS"
	natsSubject      = "payments.charge"
	natsDeadSubject  = "payments.dead"
	natsConsumer     = "payments"
	natsKeyHeader    = "Idempotency-Key"
	natsReasonHeader = "Onceonly-Reason"
	amqpQueue        = "payments.charge"
	amqpDeadQueue    = "payments.charge.dead"
)

// chaosBroker is a private broker of a consumer chaos run: publication
// (each confirmed by the broker), a restart, and what is left at the end.
type chaosBroker interface {
	url() string
	// publish publishes body with key ("": none) once. An error leaves
	// the outcome unknown: the broker may have stored it.
	publish(ctx context.Context, key, body string) error
	// restart stops the broker and starts it again on the same data.
	restart()
	// deadLetters returns the dead letters, each one's key, reason and
	// body; logs are the consumers', where RabbitMQ's reasons are.
	deadLetters(ctx context.Context, logs string) ([]deadLetter, error)
	// pending returns the messages of payments.charge not settled: on
	// RabbitMQ only those no consumer holds.
	pending(ctx context.Context) (int, error)
	close()
}

// deadLetter is one message as the dead-letter queue or subject keeps it.
type deadLetter struct {
	key, reason, body string
}

// natsChaos is a private nats-server.
type natsChaos struct {
	srv *oncetest.NATSServer
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newNATSChaos(t *testing.T) *natsChaos {
	srv := oncetest.NewNATSServer(t)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to nats: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return &natsChaos{srv: srv, nc: nc, js: js}
}

func (b *natsChaos) url() string { return b.srv.URL() }
func (b *natsChaos) restart()    { b.srv.Restart() }
func (b *natsChaos) close()      { b.nc.Close() }

func (b *natsChaos) publish(ctx context.Context, key, body string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: natsSubject, Header: nats.Header{natsKeyHeader: {key}}, Data: []byte(body)})
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return nil
}

func (b *natsChaos) deadLetters(ctx context.Context, _ string) ([]deadLetter, error) {
	cons, err := b.js.OrderedConsumer(ctx, natsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{natsDeadSubject}})
	if err != nil {
		return nil, fmt.Errorf("read the dead letters: %w", err)
	}
	var out []deadLetter
	for {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			return nil, fmt.Errorf("read the dead letters: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			out = append(out, deadLetter{key: msg.Headers().Get(natsKeyHeader), reason: msg.Headers().Get(natsReasonHeader), body: string(msg.Data())})
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("read the dead letters: %w", err)
		}
		if n == 0 {
			return out, nil
		}
	}
}

func (b *natsChaos) pending(ctx context.Context) (int, error) {
	cons, err := b.js.Consumer(ctx, natsStream, natsConsumer)
	if err != nil {
		return 0, fmt.Errorf("find the consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer info: %w", err)
	}
	return int(info.NumPending) + info.NumAckPending, nil //nolint:gosec // G115: a test stream's pending count fits an int
}

// amqpChaos is a private RabbitMQ node. Publishers share one connection,
// dialled again after the node restarts.
type amqpChaos struct {
	srv *oncetest.RabbitMQServer

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newAMQPChaos(t *testing.T) *amqpChaos { return &amqpChaos{srv: oncetest.NewRabbitMQServer(t)} }

func (b *amqpChaos) url() string { return b.srv.URL() }
func (b *amqpChaos) restart()    { b.srv.Restart() }

func (b *amqpChaos) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn != nil {
		_ = b.conn.Close()
	}
}

// channel returns the publishers' channel, in confirm mode, dialling again
// when the connection is gone.
func (b *amqpChaos) channel() (*amqp.Channel, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn != nil && !b.conn.IsClosed() && !b.ch.IsClosed() {
		return b.ch, nil
	}
	if b.conn != nil {
		_ = b.conn.Close()
		b.conn = nil
	}
	conn, err := amqp.Dial(b.srv.URL())
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open a confirm channel: %w", err)
	}
	b.conn, b.ch = conn, ch
	return ch, nil
}

func (b *amqpChaos) publish(ctx context.Context, key, body string) error {
	ch, err := b.channel()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", amqpQueue, false, false, amqp.Publishing{
		MessageId: key, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
	})
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	acked, err := conf.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("wait for the confirm: %w", err)
	case !acked:
		return errors.New("nacked by the broker")
	}
	return nil
}

// rejectedLine is onceamqp's log line of a dead letter: its message id and
// reason.
var rejectedLine = regexp.MustCompile(`dead-lettering the message.* message_id=("(?:[^"\\]|\\.)*"|\S*) .*reason=(\w+)`)

// deadLetters takes every message off payments.charge.dead; each one's
// reason is the one the consumers logged for its message id (the
// rejection's x-death says only "rejected").
func (b *amqpChaos) deadLetters(_ context.Context, logs string) ([]deadLetter, error) {
	reasons := map[string]string{}
	for _, m := range rejectedLine.FindAllStringSubmatch(logs, -1) {
		id := m[1]
		if unquoted, err := strconv.Unquote(id); err == nil {
			id = unquoted
		}
		if prev, ok := reasons[id]; ok && prev != m[2] {
			m[2] = prev + "," + m[2] // two reasons for one id: a violation the checks report
		}
		reasons[id] = m[2]
	}
	ch, err := b.channel()
	if err != nil {
		return nil, err
	}
	var out []deadLetter
	for {
		d, ok, err := ch.Get(amqpDeadQueue, true)
		if err != nil {
			return nil, fmt.Errorf("get a dead letter: %w", err)
		}
		if !ok {
			return out, nil
		}
		reason := reasons[d.MessageId]
		if deaths, _ := d.Headers["x-death"].([]any); len(deaths) == 0 {
			reason = "no x-death"
		}
		out = append(out, deadLetter{key: d.MessageId, reason: strings.TrimSpace(reason), body: string(d.Body)})
	}
}

func (b *amqpChaos) pending(context.Context) (int, error) {
	ch, err := b.channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(amqpQueue, true, false, false, false, nil)
	if err != nil {
		b.close() // the failed declaration closed the channel
		return 0, fmt.Errorf("inspect %s: %w", amqpQueue, err)
	}
	return q.Messages, nil
}
