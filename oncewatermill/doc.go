// Package oncewatermill is router middleware for Watermill
// (github.com/ThreeDotsLabs/watermill) that runs a handler once per
// logical message with an onceonly.Engine, whatever the pub/sub (Kafka,
// AMQP, NATS, SQL, SQS, Pub/Sub) and however often it delivers the message
// or publishers send it, and settles every message from the engine's
// answer (onceonly.SettlePolicy).
//
//	once, err := oncewatermill.NewMiddleware(engine, oncewatermill.Options{})
//	poison, err := middleware.PoisonQueueWithFilter(publisher, "orders_poison", oncewatermill.IsDeadLetter)
//	router.AddMiddleware(poison, once) // the poison queue outside
//	router.AddHandler("book_order", "orders", subscriber, "receipts", publisher,
//		func(msg *message.Message) ([]*message.Message, error) {
//			ctx := msg.Context()
//			tx, err := onceonly.Tx(ctx) // commits with the key (see below for watermill-sql)
//			if err != nil {
//				return nil, err
//			}
//			if _, err := tx.Exec(ctx, `INSERT INTO bookings (body) VALUES ($1)`, msg.Payload); err != nil {
//				return nil, err // the key fails: the message comes again
//			}
//			return message.Messages{receipt(msg)}, nil // stored with the key, returned on every replay
//		})
//	err = engine.Start(ctx) // the relay, the reconciler and the resumer
//
// # The key and the scope
//
// The key is the idempotency_key metadata field (DefaultKeyMetadata;
// Options.KeyMetadata or Options.Key to choose another). The publisher
// sets it once per logical message and keeps it across its own retries,
// the way an HTTP client keeps its Idempotency-Key. The message UUID is a
// fallback only (Options{Key: UUIDKey}): a publisher that retries by
// building the message again, a forwarder or an outbox relay gives a
// copy a new UUID, which then runs again; and a UUID says nothing of the
// tenant that sent it. The scope is the router handler's name unless
// Options.Scope or Options.ScopeOf says otherwise (Metadata("tenant_id")
// for a tenant's), so two handlers consuming one message each run once.
// The payload is what the key's first execution is compared with: the
// same key with another payload is dead-lettered, not run.
//
// # What a message becomes
//
//   - the key's first execution commits, or the key is completed already
//     (a copy, a redelivery): the handler's produced messages are returned
//     to the router, which publishes them and acks the message;
//   - another execution holds the key (a copy in flight elsewhere): the
//     middleware waits about the engine's Retry-After (at most
//     onceonly.MaxInFlightRetry) and nacks the message, so the pub/sub
//     delivers it again; it is not counted as a failure, and the copy is
//     acked as a replay once the holder commits;
//   - the handler failed (an error or a panic): nacked after a backoff
//     (SettlePolicy.MinBackoff doubled per failure, at most MaxBackoff),
//     and dead-lettered (ReasonFailed) once SettlePolicy.MaxFailures
//     executions of the key failed;
//   - the key was used with another payload (ReasonReused), or the message
//     has no key, an invalid one, or fails Options.Key, ScopeOf or Payload
//     (ReasonInvalid; no key row is written): the middleware sets the
//     onceonly_reason metadata (ReasonMetadata) and returns a
//     DeadLetterError, which middleware.PoisonQueue publishes to the poison
//     topic (with its own reason_poisoned) before the router acks.
//
// A retry is a nack the middleware sends itself after the wait, with no
// error returned: a poison queue outside (with or without a filter) takes
// only dead letters, middleware.Retry outside never runs the handler
// again in place, and the router's log holds no error for a copy in
// flight. The middleware logs and counts each settlement
// (onceonly_watermill_messages_total) and reports it to Options.Settled.
// The wait holds the handler's goroutine and, on pub/subs that deliver one
// message at a time (AMQP, SQL), the subscription: keep MaxBackoff short.
// Without a poison queue a dead letter is nacked and comes back forever.
//
// # Produced messages
//
// The messages a handler returns are stored with the key's result (their
// UUIDs, metadata and payloads, as JSON; Content-Type ResultContentType)
// and returned again, as they were, on every replay. A crash between the
// key's commit and the end of the publish loses nothing: the redelivery
// replays and the router publishes the same messages again, with the same
// UUIDs, so consumers downstream deduplicate them by UUID (or by an
// idempotency_key the handler set on them).
//
// # watermill-sql: one transaction for the key and the ack
//
// watermill-sql's subscriber consumes each message in a transaction of its
// own and hands it to the handler (watermill-sql's TxFromContext); the
// transaction commits the consumer group's offset, or deletes the queue
// row, when the message is acked. The middleware joins it: the key's
// claim and completion run in a savepoint of that transaction
// (Engine.DoTx for pgx, Engine.DoSQLTx for database/sql), so the key, the
// handler's writes (through TxFromContext, onceonly.Tx or onceonly.SQLTx:
// one transaction) and the ack commit together, after the router published
// the produced messages. What holds:
//
//   - the business writes, the key and the ack commit together or not at
//     all: a crash before the commit leaves the message to be delivered
//     again and run again, as if it never ran;
//   - the produced messages are published before that commit, so a crash
//     between the two publishes them, and the rerun publishes its own:
//     give them UUIDs from ProducedUUID, which every run of the key
//     derives alike, and downstream deduplicates them;
//   - watermill-sql begins REPEATABLE READ: a key whose row changed after
//     the transaction took its snapshot (a copy in flight elsewhere that
//     renews its lease) cannot be claimed in it; the middleware retries
//     such a conflict like a copy in flight, and it is replayed from Redis
//     once the holder commits, or from Postgres in the next transaction;
//   - a failed run leaves no row (its savepoint is rolled back), so the
//     engine counts no failure: the middleware counts them in memory, so
//     that MaxFailures holds within a process, and forgets them at a
//     restart;
//   - a nacked message is delivered again in the same transaction, until
//     it is acked or AckDeadline (30 s by default) ends it: keep a
//     message's handler and its retry delays well below AckDeadline.
//
// One hazard is watermill-sql's, with or without the middleware: when the
// router closes (or AckDeadline passes) while a handler runs, the
// subscriber ends the transaction without waiting for the handler, and a
// commit then keeps what the handler had written so far (here: the key's
// claim, in progress, and part of the writes); the message comes again
// once the key's lease has passed and runs again. Stop routers when no
// message is under way where that matters, and keep handlers short.
// Options.NoJoin runs every message in the engine's own transaction
// instead (the handler must then write through onceonly.Tx only).
//
// # Unlike middleware.Deduplicator
//
// Watermill's Deduplicator keeps keys in memory, per process, for a
// window, and records a key before the handler runs: a copy that reaches
// another process runs again, and when the handler fails the redelivery is
// dropped as a duplicate, so the message is lost. Here the key lives in
// Postgres (and Redis), is completed only by the commit of the handler's
// writes, and a failed run leaves it free for the redelivery.
//
// # Alongside
//
// Run Engine.Start in the process (or the relay and reconciler commands):
// the relay copies each key's state into Redis, the reconciler repairs
// drift, fails the keys of dead executions and deletes expired ones.
// Keys are kept for Config.CompletedTTL (24 h): a redelivery later than
// that runs again. See docs/consumers/watermill.md.
package oncewatermill
