// Package onceamqp consumes a RabbitMQ queue (github.com/rabbitmq/amqp091-go)
// with an onceonly.Engine: each logical message runs its handler once,
// however often the broker delivers it and however often publishers send
// it, and every delivery is settled from the engine's answer
// (onceonly.SettlePolicy).
//
//	c, err := onceamqp.NewConsumer(engine, func(ctx context.Context, msg onceamqp.Message) error {
//		charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (gateway.Charge, error) {
//			return gw.Charge(ctx, key, chargeRequest(msg.Payload)) // key: the downstream idempotency key
//		})
//		if err != nil {
//			return err // unknown outcome: the delivery is kept until the key settles
//		}
//		tx, err := onceonly.Tx(ctx) // the ledger row commits with the key
//		if err != nil {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO ledger (charge_id) VALUES ($1)`, charge.ID)
//		return err
//	}, onceamqp.Options{URL: amqpURL, Queue: "payments.charge", Scope: "payments"})
//	err = engine.Start(ctx) // the relay, the reconciler, the resumer: in this process
//	err = c.Run(ctx)        // until ctx ends; reconnects by itself
//
// # The key
//
// The key is the message-id property (Options.Key to choose another, such
// as a header: HeaderKey). It must name the logical message, as the
// publisher generated it once and kept it across its own retries; never
// the delivery tag, which numbers deliveries on one channel and changes
// with every redelivery. The payload (the body, or Options.Payload) is
// what the key's first execution is compared with: the same key with
// another payload is dead-lettered, not run.
//
// # What a delivery becomes
//
//   - the key's first execution commits, or the key is completed already
//     (a copy, a redelivery): Ack, after the commit;
//   - another execution holds the key: the delivery is held and then
//     requeued (Nack with requeue) after about the engine's Retry-After,
//     capped at a second; a copy then finds the key completed and is acked;
//   - the handler failed: requeued the same way after a backoff
//     (SettlePolicy.MinBackoff doubled per failure, at most MaxBackoff), and
//     dead-lettered (ReasonFailed) once SettlePolicy.MaxFailures executions
//     of the key ended failed;
//   - a step's outcome is unknown (the execution was handed off to a
//     resumption): requeued after MinBackoff, again and again, until the key
//     settles (by Engine.Resume or by this redelivery), and never
//     dead-lettered for that;
//   - the key was used with another payload (ReasonReused), or the message
//     has no key, an invalid one, or fails Options.Scope, Key or Payload
//     (ReasonInvalid): Reject without requeue, so the queue's dead-letter
//     exchange receives it with RabbitMQ's x-death header. No key row is
//     written for an invalid message.
//
// The reason is logged and counted (onceonly_amqp_deliveries_total). A
// queue without a dead-letter exchange drops what is rejected: declare one
// (DeclareQueue does). RabbitMQ moves a quorum queue's dead letters at most
// once by default, without confirms, and loses those it sends while the
// dead-letter queue is not ready (a broker restarting); DeclareQueue
// declares at-least-once dead-lettering instead (Queue.DeadLetters): none
// is lost, and one may arrive twice.
//
// # Why the delivery is held, not sent through a delay queue
//
// A retry holds the delivery unacknowledged for Settlement.After and then
// requeues it: no topology besides the queue, no copy republished, and the
// broker's own redelivery, at once, if the consumer dies meanwhile. The
// cost: a held delivery occupies a prefetch slot (Options.Prefetch) and
// counts against the channel's consumer_timeout, and on a quorum queue
// each requeue is a return that x-delivery-count counts. Give quorum
// queues no delivery limit (x-delivery-limit): SettlePolicy.MaxFailures is
// the limit that counts executions, not deliveries; with one, set it well
// above MaxFailures plus the requeues of keys in flight or handed off, or
// a message would be dead-lettered by the broker without its reason.
// DeclareQueue declares none by default, as the broker's version
// understands it: RabbitMQ 4's quorum queues have a limit of 20 unless
// x-delivery-limit is -1, which before 4.0 would dead-letter a message at
// its first return.
//
// # Connections and shutdown
//
// Run (or Start) dials the broker, runs Options.Declare on the
// connection, opens a channel with Qos Prefetch and consumes with Workers
// goroutines, each running the deliveries it takes in batches
// (Options.BatchSize, Options.BatchLinger): one transaction and one commit
// per batch (onceonly.Engine.DoBatch), each delivery under a savepoint of
// its own, settled after the commit. A lost
// connection or channel (a broker restart, a network cut, a channel
// closed by consumer_timeout, the consumer cancelled because the queue
// went away) is redialled with backoff, forever; deliveries of the lost
// channel are not settled on the new one (their tags mean nothing there):
// the broker has requeued them. Stop, or the end of Run's context, stops
// consuming, lets the executions under way finish and settle for up to
// Options.ShutdownTimeout (their contexts are canceled past it), and closes
// the channel: RabbitMQ requeues every delivery left unsettled.
//
// # Leases against consumer_timeout
//
// RabbitMQ closes a channel whose delivery stays unacknowledged longer than
// consumer_timeout (30 minutes by default). The engine's lease is renewed
// while a handler runs, so an execution longer than consumer_timeout is not
// lost: the channel closes, the delivery is requeued, its redelivery finds
// the key in flight and is held and requeued until the execution commits,
// then acked. Keep a delivery's whole stay (waiting in the prefetch
// buffer, the handler, a held retry: at most SettlePolicy.MaxBackoff) well
// below consumer_timeout anyway.
//
// # Alongside
//
// Run the engine's resumer in every process that registers the handler (it
// finishes an execution whose process died after a step started, with no
// redelivery needed), and the relay and the reconciler as for every use of
// the engine: engine.Start runs all three. See docs/consumers/rabbitmq.md.
package onceamqp
