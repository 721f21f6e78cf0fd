// Package oncesqs consumes an Amazon SQS queue
// (github.com/aws/aws-sdk-go-v2/service/sqs) with an onceonly.Engine: each
// logical message runs its handler once, however often SQS delivers it and
// however often producers send it, and every message is settled on SQS
// from the engine's answer (onceonly.SettlePolicy).
//
//	c, err := oncesqs.NewConsumer(engine, func(ctx context.Context, msg oncesqs.Message) error {
//		tx, err := onceonly.Tx(ctx) // the ledger row commits with the key
//		if err != nil {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO ledger (order_id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
//		return err
//	}, oncesqs.Options{
//		Client: sqs.NewFromConfig(cfg), QueueURL: queueURL, DeadLetterQueueURL: deadURL,
//		Scope: "payments",
//	})
//	err = engine.Start(ctx) // the relay, the reconciler and the resumer, beside the consumer
//	err = c.Run(ctx)        // until ctx ends
//
// # The key
//
// The key is the Idempotency-Key message attribute (a String; Options.Key
// to choose another): the ID the producer made once for the logical
// message and kept across its own retries, never the MessageId, which SQS
// gives each send, nor a receipt handle, which names one receive. The
// payload (the body, or Options.Payload) is what the key's first execution
// is compared with: the same key with another payload is dead-lettered,
// not run.
//
// # What a message becomes
//
//   - the key's first execution commits, or the key is completed already
//     (a copy, a redelivery): deleted after the commit, in batches
//     (DeleteMessageBatch: the deletes workers ask for while a batch is on
//     its way go in the next one, so none waits for a timer); a delete lost
//     brings the message back after its visibility timeout, to be deleted
//     as a replay;
//   - another execution holds the key: its visibility is set to about the
//     engine's Retry-After (ChangeMessageVisibility, whole seconds rounded
//     up: a second), not counted as a failure; the copy then finds the key
//     completed and is deleted;
//   - the handler failed: made visible again after a backoff (SettlePolicy
//     MinBackoff doubled per failure, at most MaxBackoff, rounded up to
//     whole seconds), and dead-lettered (ReasonFailed) once
//     SettlePolicy.MaxFailures executions of the key ended failed; a later
//     copy of the key (sent again once the cause is fixed) runs again;
//   - a step's outcome is unknown (the execution was handed off to a
//     resumption): made visible again after MinBackoff, again and again,
//     until the key settles; never dead-lettered for that;
//   - the key was used with another payload (ReasonReused), or the message
//     has no key, an invalid one, or fails Options.ScopeOf, Key or Payload
//     (ReasonInvalid): a copy is sent to Options.DeadLetterQueueURL with
//     the body, the original message attributes and Onceonly-Reason (and
//     Onceonly-Error, for people), then the message is deleted. No key row
//     is written for an invalid message.
//
// No path deletes a message before its key's commit or its dead letter's
// send: a call that fails leaves the message to come back after its
// visibility timeout. A dead letter whose message could not be deleted
// afterwards is sent again when the message comes back: on a standard
// dead-letter queue, two copies (a FIFO one drops the second within five
// minutes, by its deduplication ID dead-<MessageId>).
//
// SQS takes 10 message attributes a message: a message with 9 gets
// Onceonly-Reason but not Onceonly-Error, one with 10 neither (the reason
// is then in the log and the metrics only). The original attributes are
// never dropped.
//
// # Dead letters: the consumer's, not a redrive policy's
//
// SQS's redrive policy moves a message to a dead-letter queue once it was
// received maxReceiveCount times. Every receive counts: those of a copy
// turned away because its key is in flight elsewhere, those of a message
// whose execution was handed off, those after a lost delete. A redrive
// policy would dead-letter a copy that was about to be deleted as a
// replay, with no reason, and count deliveries, not failed executions. So
// the consumer dead-letters by itself (SettlePolicy.MaxFailures counts
// failed executions of the key; an in-flight copy is never dead-lettered)
// and the queue should have no redrive policy. Keep one only as a last
// resort against a consumer bug, with a maxReceiveCount far above
// MaxFailures plus the receives of a key in flight: about
// (longest execution + lease) / 1 s for each copy sent while it runs, and
// a handed-off key's until its resumption ends; 1000 is a reasonable
// floor. The consumer warns at start when the queue has one.
//
// # Visibility and the heartbeat
//
// A received message stays hidden for its visibility timeout (the queue's,
// or Options.VisibilityTimeout). While its execution runs, the consumer
// extends it (ChangeMessageVisibility to the full timeout) every third of
// the shorter of the timeout and the engine's lease, as the engine renews
// the lease: a long execution keeps its message, and a dead process's
// message comes back about when its lease runs out, so a takeover can
// finish the key. SQS caps a message's visibility at 12 hours from its
// receive: an execution longer than that loses its message to another
// receive, whose copy then waits (in flight) for the key. A receive asks
// for at most as many messages as workers are free, so no message waits
// hidden for a worker.
//
// # FIFO queues
//
// A FIFO queue's MessageDeduplicationId (or its content-based
// deduplication) drops a second send of the same ID within five minutes,
// across the queue (or the message group, with per-group deduplication):
// a producer's retries, while it runs. It does not cover a send after the
// five minutes, a second producer that makes its own ID, two tenants who
// choose the same ID (one loses a message), nor any redelivery: a message
// whose visibility timeout ran out, or whose delete was lost, is received
// again whatever its deduplication ID. onceonly's key covers all of those,
// per scope, for as long as the key is kept; producers may set both (the
// deduplication ID to <scope>/<key> is a good first filter). The consumer
// never relies on the deduplication ID. Beware ordering: a retried message
// (visibility changed) holds back its message group until it is deleted
// or dead-lettered; a dead letter on a FIFO dead-letter queue keeps the
// original's MessageGroupId.
//
// # Connections and shutdown
//
// Run (or Start) reads the queue's visibility timeout, then runs
// Options.Receivers long polls (Options.WaitTime) and handles messages with
// Options.Workers goroutines. A failed receive is retried with backoff.
// Stop, or the end of Run's context, cancels the long polls, lets the
// executions under way finish and settle for up to Options.ShutdownTimeout
// (their contexts are canceled past it), and makes messages received while
// it stopped visible again at once. A poll canceled by the stop may have
// received messages SQS then keeps hidden until their visibility timeout.
//
// # Alongside
//
// Every process that creates the consumer (which registers the handler)
// runs the engine's resumer, which finishes an execution whose process died
// after a step started with no redelivery needed, and the relay and the
// reconciler run as for every use of the engine: engine.Start(ctx) runs all
// three. See docs/consumers/sqs.md.
package oncesqs
