// Package onceonly makes retried requests and redelivered messages safe: for
// each (scope, key) the business effect happens once, and every retry gets
// the same answer.
//
// Postgres is the source of truth: a key's state, the business writes and an
// outbox event commit in one transaction. Redis is a cache that answers
// replays, conflicts and reused keys in one Lua round trip; it may be lost at
// any moment without a duplicate effect.
//
// Use Engine.Middleware for net/http services and Engine.Do for message
// consumers. Both follow one flow:
//
//  1. validate the key (ValidateKey);
//  2. ask Redis (replay, in flight, reused, or a provisional claim);
//  3. claim the key in Postgres under a lease owned by this execution;
//  4. run the handler: its steps, then a transaction that completes the key,
//     fenced by the owner, so a worker whose lease was taken over rolls back;
//  5. write the result through to Redis (the relay delivers it anyway).
//
// Handlers that call systems outside Postgres (a payment gateway) run
// their calls as steps (Step), each with a downstream idempotency key and
// recovery points, before the final transaction (Tx); a live engine
// (Resume) finishes an execution whose process died after a step started.
// See docs/steps.md.
//
// A service on database/sql (an ORM, sqlx, sqlc) writes through a *sql.Tx
// instead: Config.DB and SQLTx, DoSQL, or DoSQLTx for a transaction of its
// own. See docs/library.md.
//
// The key states are in_progress, completed and failed; every transition
// bumps a version that Redis applies only when it is higher than what it
// holds. The invariants the engine keeps, which comments across the code cite
// by name, are stated in docs/invariants.md, and the life of a key,
// statement by statement, in docs/state-machine.md.
package onceonly
