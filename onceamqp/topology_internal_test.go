package onceamqp

import (
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// The arguments of each queue for each kind of broker version: the
// delivery limit that means none depends on it (RabbitMQ 4 only is tested
// here: the tests' broker is 3.10).
func TestQueueArguments(t *testing.T) {
	t.Parallel()
	q := Queue{Name: "w", DeadLetterExchange: "x", DeadLetterQueue: "d"}
	atLeastOnce := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "x",
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
	with := func(args amqp.Table, key string, v any) amqp.Table {
		out := maps.Clone(args)
		out[key] = v
		return out
	}
	quorum := amqp.Table{"x-queue-type": "quorum"}
	for _, c := range []struct {
		name       string
		version    string
		q          func(Queue) Queue
		work, dead amqp.Table
	}{
		{"3.x, no limit", "3.10.8", nil, atLeastOnce, quorum},
		{"4.x, no limit", "4.0.5", nil, with(atLeastOnce, "x-delivery-limit", -1), with(quorum, "x-delivery-limit", -1)},
		{"4.x, a limit", "4.1.0", func(q Queue) Queue { q.DeliveryLimit = 5; return q },
			with(atLeastOnce, "x-delivery-limit", 5), with(quorum, "x-delivery-limit", -1)},
		{"3.x, a limit", "3.13.7", func(q Queue) Queue { q.DeliveryLimit = 5; return q }, with(atLeastOnce, "x-delivery-limit", 5), quorum},
		{"4.x, unset", "4.0.5", func(q Queue) Queue { q.DeliveryLimit = DeliveryLimitUnset; return q }, atLeastOnce, quorum},
		{"unknown version, a limit", "", func(q Queue) Queue { q.DeliveryLimit = 5; return q }, with(atLeastOnce, "x-delivery-limit", 5), quorum},
		{"at most once", "4.0.5", func(q Queue) Queue { q.DeadLetters = AtMostOnce; return q },
			amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "x", "x-delivery-limit": -1}, with(quorum, "x-delivery-limit", -1)},
		{"classic", "4.0.5", func(q Queue) Queue { q.Classic = true; return q },
			amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "x"}, amqp.Table{"x-queue-type": "classic"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			qq := q
			if c.q != nil {
				qq = c.q(q)
			}
			args, err := qq.arguments(amqp.Table{"version": c.version})
			require.NoError(t, err)
			require.Equal(t, c.work, args.work)
			require.Equal(t, c.dead, args.dead)
		})
	}
	_, err := q.arguments(amqp.Table{"product": "not RabbitMQ"})
	require.ErrorContains(t, err, "set Queue.DeliveryLimit")
}
