package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncenats"
	"github.com/onceonly/onceonly/oncetest"
)

// testBroker is one of the brokers the consumer runs on, as the tests see
// it: its URL, the demo topology reset, publication, the dead letters and
// the messages left.
//
// The topology's names are fixed (docs/consumers.md), so the tests of this package
// that use a broker run one after the other and reset it first; no other
// package declares those names on the shared test brokers.
type testBroker interface {
	// name is the subtest's name.
	name() string
	// url is the consumer's BROKER_URL.
	url() string
	// reset deletes the demo topology: the consumer declares it again.
	reset(t *testing.T)
	// publish publishes body with key ("": no key) once.
	publish(t *testing.T, key, body string)
	// deadLetters returns the dead letters so far: each one's key and
	// reason (logs are the consumer's, where RabbitMQ's reasons are).
	deadLetters(t *testing.T, logs string) []deadLetter
	// left returns how many messages wait in payments.charge, delivered
	// or not: on RabbitMQ, with no consumer connected (a consumer's
	// unacknowledged deliveries are not counted).
	left(t *testing.T) int
	// metric is the consumer's counter of settled messages.
	metric() string
	// dropConnections cuts the consumer off the broker: the consumer must
	// reconnect by itself.
	dropConnections(t *testing.T)
}

// deadLetter is a dead-lettered message as the dead-letter queue or
// subject keeps it.
type deadLetter struct {
	key, reason string
}

// natsBroker is the shared test nats-server (TEST_NATS_URL), or a private
// one that can be restarted.
type natsBroker struct {
	addr    string
	private *oncetest.NATSServer
}

func (b *natsBroker) name() string { return "nats" }
func (b *natsBroker) url() string  { return b.addr }

func (b *natsBroker) js(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(b.addr)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

func (b *natsBroker) reset(t *testing.T) {
	err := b.js(t).DeleteStream(oncetest.Context(t), oncenats.DemoTopology().Stream)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		require.NoError(t, err)
	}
}

func (b *natsBroker) publish(t *testing.T, key, body string) {
	t.Helper()
	require.NoError(t, publishNATS(oncetest.Context(t), b.addr, key, []byte(body), 1))
}

func (b *natsBroker) deadLetters(t *testing.T, _ string) []deadLetter {
	t.Helper()
	ctx := oncetest.Context(t)
	topo := oncenats.DemoTopology()
	cons, err := b.js(t).OrderedConsumer(ctx, topo.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{topo.DeadLetterSubject}})
	require.NoError(t, err)
	var out []deadLetter
	for {
		batch, err := cons.FetchNoWait(100)
		require.NoError(t, err)
		n := 0
		for msg := range batch.Messages() {
			n++
			out = append(out, deadLetter{key: msg.Headers().Get(oncenats.DefaultKeyHeader), reason: msg.Headers().Get(oncenats.HeaderReason)})
		}
		require.NoError(t, batch.Error())
		if n == 0 {
			return out
		}
	}
}

func (b *natsBroker) left(t *testing.T) int {
	t.Helper()
	topo := oncenats.DemoTopology()
	cons, err := b.js(t).Consumer(oncetest.Context(t), topo.Stream, topo.Consumer)
	require.NoError(t, err)
	info, err := cons.Info(oncetest.Context(t))
	require.NoError(t, err)
	return int(info.NumPending) + info.NumAckPending //nolint:gosec // G115: a test stream's pending count fits an int
}

func (b *natsBroker) metric() string { return "onceonly_nats_messages_total" }

// dropConnections restarts the private server (kill -9, as a crash).
func (b *natsBroker) dropConnections(t *testing.T) {
	require.NotNil(t, b.private, "a private nats-server is restarted, not the shared one")
	b.private.Restart()
}

// amqpBroker is the shared test RabbitMQ (TEST_AMQP_URL).
type amqpBroker struct{ addr string }

func (b *amqpBroker) name() string { return "rabbitmq" }
func (b *amqpBroker) url() string  { return b.addr }

func (b *amqpBroker) channel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(b.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

func (b *amqpBroker) reset(t *testing.T) {
	ch := b.channel(t)
	for _, q := range []string{demoQueue.Name, demoQueue.DeadLetterQueue} {
		_, err := ch.QueueDelete(q, false, false, false)
		require.NoError(t, err)
	}
	require.NoError(t, ch.ExchangeDelete(demoQueue.DeadLetterExchange, false, false))
}

func (b *amqpBroker) publish(t *testing.T, key, body string) {
	t.Helper()
	require.NoError(t, publishAMQP(oncetest.Context(t), b.addr, key, []byte(body), 1))
}

// rejectedLine is onceamqp's log line of a dead letter.
var rejectedLine = regexp.MustCompile(`dead-lettering the message.* message_id=("(?:[^"\\]|\\.)*"|\S*) .*reason=(\w+)`)

// deadLetters takes the dead letters off payments.charge.dead, checks each
// carries RabbitMQ's x-death from payments.charge, and finds its reason in
// the consumer's logs.
func (b *amqpBroker) deadLetters(t *testing.T, logs string) []deadLetter {
	t.Helper()
	reasons := map[string]string{}
	for _, m := range rejectedLine.FindAllStringSubmatch(logs, -1) {
		id := m[1]
		if unquoted, err := strconv.Unquote(id); err == nil {
			id = unquoted
		}
		reasons[id] = m[2]
	}
	ch := b.channel(t)
	var out []deadLetter
	for {
		d, ok, err := ch.Get(demoQueue.DeadLetterQueue, false)
		require.NoError(t, err)
		if !ok {
			return out
		}
		deaths, _ := d.Headers["x-death"].([]any)
		require.NotEmpty(t, deaths, "a dead letter carries x-death: %v", d.Headers)
		death, _ := deaths[0].(amqp.Table)
		require.Equal(t, "rejected", death["reason"], "x-death names the rejection")
		require.Equal(t, demoQueue.Name, death["queue"])
		out = append(out, deadLetter{key: d.MessageId, reason: reasons[d.MessageId]})
		// Requeued, so the next call sees it again.
		defer func() { _ = d.Nack(false, true) }()
	}
}

func (b *amqpBroker) left(t *testing.T) int {
	t.Helper()
	q, err := b.channel(t).QueueDeclarePassive(demoQueue.Name, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func (b *amqpBroker) metric() string { return "onceonly_amqp_deliveries_total" }

// dropConnections closes the consumer's connection from the broker's
// side, as a node going down does.
func (b *amqpBroker) dropConnections(t *testing.T) {
	require.Positive(t, oncetest.CloseAMQPConnections(t, "onceonly consumer"))
}

// settled sums the consumer's counter of settled messages with
// disposition and reason ("" for any).
func settled(t *testing.T, b testBroker, d *oncetest.Daemon, disposition, reason string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(oncetest.Context(t), http.MethodGet, "http://"+d.Addr+"/metrics", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	n := 0
	for line := range strings.Lines(string(raw)) {
		if !strings.HasPrefix(line, b.metric()+"{") || !strings.Contains(line, `disposition="`+disposition+`"`) ||
			(reason != "" && !strings.Contains(line, `reason="`+reason+`"`)) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		require.NoError(t, err)
		n += int(v)
	}
	return n
}

// message is a payment message's body.
func message(merchant, source string, amount int) string {
	return fmt.Sprintf(`{"merchant":%q,"amount":%d,"currency":"usd","customer":"cus_1","source":%q}`, merchant, amount, source)
}
