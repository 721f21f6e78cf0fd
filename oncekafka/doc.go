// Package oncekafka is a Kafka consumer-group member
// (github.com/twmb/franz-go/pkg/kgo) that runs each logical message once
// through an onceonly.Engine: however often Kafka hands a record over
// again (a crash before the offset commit, a rebalance) and however often
// producers send a message, its handler's effects happen once, and the
// group's committed offsets advance only over records that are settled.
//
//	c, err := oncekafka.NewConsumer(engine, func(ctx context.Context, msg oncekafka.Message) error {
//		tx, err := onceonly.Tx(ctx) // the ledger row commits with the key
//		if err != nil {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO ledger (order_id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
//		return err
//	}, oncekafka.Options{
//		Brokers: brokers, Group: "ledger", Topics: []string{"orders"},
//		Scope: "orders", DeadLetterTopic: "orders.dead",
//	})
//	err = engine.Start(ctx) // the relay, the reconciler and the resumer, beside the consumer
//	err = c.Run(ctx)        // until ctx ends
//
// # The key
//
// The key is the Idempotency-Key header (Options.Key to choose another):
// the ID the producer made once for the logical message and kept across
// its own retries. Never the record's offset, which numbers copies, and
// not the record's Kafka key, which names what the record is partitioned
// by (an account, an order) and is shared by many messages. The payload
// (the value, or Options.Payload) is what the key's first execution is
// compared with: the same key with another payload is dead-lettered.
//
// # What a record becomes
//
//   - Ack (the key's execution committed, or an earlier copy's did): the
//     record is settled.
//   - Retry (a copy of the key is in flight elsewhere, the execution
//     failed or was handed off, the store is unavailable): the record runs
//     again after the settlement's delay, while the records behind it and
//     those of other partitions go on.
//   - DeadLetter (a reused key, an invalid record, a key that failed
//     Policy.MaxFailures times): a copy is produced to DeadLetterTopic
//     (the record's key, value and headers, plus Onceonly-Reason,
//     Onceonly-Error, Onceonly-Topic, -Partition and -Offset), then the
//     record is settled. A copy of the key that comes later runs again.
//
// # Offsets
//
// Each partition keeps the records taken from Kafka, in offset order,
// until they settle; the offset committed (every CommitInterval, when a
// partition is revoked, and at Stop) is the one after the longest settled
// prefix. A crash or a rebalance therefore never skips a record that was
// not settled: its new owner runs it, and the records after it that had
// settled, again — as replays, which the engine answers from the key's
// state without running the handler. A partition whose unsettled records
// reach PartitionWindow is paused until the oldest settle.
//
// # Rebalances
//
// The client blocks rebalances between a poll and the moment its records
// are registered (kgo.BlockRebalanceOnPoll), so the commits a member makes
// name only partitions it owns. A revoked partition's settled prefix is
// committed, its queued records and retries are dropped for the new
// owner, and its executions under way are left to finish: the engine's
// lease fences them (a new owner's copy is turned away as in flight until
// the key completes or its lease runs out; an execution whose lease was
// taken over cannot commit), and their settlements are discarded.
//
// See docs/consumers/kafka.md.
package oncekafka
