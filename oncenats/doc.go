// Package oncenats consumes a NATS JetStream pull consumer
// (github.com/nats-io/nats.go/jetstream) with an onceonly.Engine: each
// logical message runs its handler once, however often the server
// delivers it and however often publishers send it, and every message is
// settled on the server from the engine's answer (onceonly.SettlePolicy).
//
//	topo := oncenats.DemoTopology() // stream PAYMENTS, durable pull consumer payments
//	c, err := oncenats.NewConsumer(engine, func(ctx context.Context, msg oncenats.Message) error {
//		charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (gateway.Charge, error) {
//			return gw.Charge(ctx, key, chargeRequest(msg.Payload)) // key: the downstream idempotency key
//		})
//		if err != nil {
//			return err // unknown outcome: the message is not acked until the key settles
//		}
//		tx, err := onceonly.Tx(ctx) // the ledger row commits with the key
//		if err != nil {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO ledger (charge_id) VALUES ($1)`, charge.ID)
//		return err
//	}, oncenats.Options{
//		JetStream: js, Stream: topo.Stream, Consumer: topo.Consumer, Declare: topo.Declare,
//		Scope: "payments", DeadLetterSubject: topo.DeadLetterSubject,
//	})
//	err = engine.Start(ctx) // the relay, the reconciler and the resumer, beside the consumer
//	err = c.Run(ctx)        // until ctx ends; survives server restarts
//
// # The key
//
// The key is the Idempotency-Key header (Options.Key to choose another):
// the ID the publisher made once for the logical message and kept across
// its own retries, never a stream or consumer sequence, which numbers
// copies and deliveries. The payload (the data, or Options.Payload) is
// what the key's first execution is compared with: the same key with
// another payload is dead-lettered, not run.
//
// Why not Nats-Msg-Id: JetStream drops a publication whose Nats-Msg-Id it
// saw within the stream's duplicate window (two minutes by default), across
// the whole stream. That is a fine first filter for a publisher's own
// retries, but not a per-tenant key: two tenants who pick the same ID lose
// one message at publication, and a copy sent after the window passes is
// stored again. Publishers may set both (the demo sets Nats-Msg-Id to
// <merchant>/<key>); the consumer never relies on Nats-Msg-Id.
//
// # What a message becomes
//
//   - the key's first execution commits, or the key is completed already
//     (a copy, a redelivery): acked after the commit, and the ack is
//     confirmed by the server (DoubleAck); an ack lost anyway brings the
//     message back after AckWait, to be acked as a replay;
//   - another execution holds the key: NakWithDelay for about the engine's
//     Retry-After (capped at a second), not counted as a failure; the copy
//     then finds the key completed and is acked;
//   - the handler failed: NakWithDelay after a backoff (SettlePolicy
//     MinBackoff doubled per failure, at most MaxBackoff), and
//     dead-lettered (ReasonFailed) once SettlePolicy.MaxFailures executions
//     of the key ended failed;
//   - a step's outcome is unknown (the execution was handed off to a
//     resumption): NakWithDelay(MinBackoff), again and again, until the key
//     settles (by Engine.Resume or by this redelivery); never dead-lettered
//     for that;
//   - the key was used with another payload (ReasonReused), or the message
//     has no key, an invalid one, or fails Options.ScopeOf, Key or Payload
//     (ReasonInvalid): a copy is published on Options.DeadLetterSubject
//     with the original headers, its own Nats-Msg-Id dead/<stream
//     sequence> and Onceonly-Reason, then the message is terminated (Term;
//     TermWithReason on servers that keep a reason, 2.10.4 and later). No
//     key row is written for an invalid message.
//
// While an execution runs, its message is marked in progress (InProgress)
// every third of the shorter of the consumer's AckWait and the engine's
// lease, as the engine renews the lease: a long execution keeps its message,
// and a dead process's message comes back about when its lease runs out.
//
// # MaxDeliver
//
// JetStream counts every delivery, NakWithDelay ones included, against a
// consumer's MaxDeliver, and drops a message past it without a dead letter.
// A key in flight elsewhere or handed off is redelivered until it settles,
// so a limit would drop messages that were about to succeed. Give the
// consumer no MaxDeliver (Topology.Declare does not set one):
// SettlePolicy.MaxFailures is the limit that counts failed executions, not
// deliveries.
//
// # Connections and shutdown
//
// Run (or Start) finds the consumer (Options.Declare, or a look-up),
// subscribes with Options.Prefetch messages ahead and handles them with
// Options.Workers goroutines, each running the messages it takes in
// batches (Options.BatchSize, Options.BatchLinger): one transaction and
// one commit per batch (onceonly.Engine.DoBatch), each message under a
// savepoint of its own, acked after the commit. nats.go reconnects by itself and the pull
// subscription asks again after a server restart; a consumer that is gone
// is looked up (or declared) again with backoff. Stop, or the end of Run's
// context, stops asking for messages, lets the executions under way finish
// and settle for up to Options.ShutdownTimeout (their contexts are canceled
// past it) and hands the messages it holds unstarted back (Nak); the
// server delivers a message left unsettled again after AckWait.
//
// # Alongside
//
// Every process that creates the consumer (which registers the handler)
// runs the engine's resumer, which finishes an execution whose process died
// after a step started with no redelivery needed, and the relay and the
// reconciler run as for every use of the engine: engine.Start(ctx) runs all
// three. See docs/consumers/nats.md.
package oncenats
