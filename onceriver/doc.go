// Package onceriver runs River (github.com/riverqueue/river) jobs once per
// logical message with an onceonly.Engine: a Worker wraps a handler, takes
// the idempotency key from the job's args, and completes the job in the
// same transaction as the handler's writes and the key.
//
//	engine.Resume(ctx) // in a goroutine: see "Resumption" below
//	w, err := onceriver.NewWorker(engine, func(ctx context.Context, args ChargeArgs) error {
//		charge, err := onceonly.Step(ctx, "charge", func(ctx context.Context, key string) (gateway.Charge, error) {
//			return gw.Charge(ctx, key, chargeRequest(args)) // key: the downstream idempotency key
//		})
//		if err != nil {
//			return err // outcome unknown: River retries, the next run calls again with the same key
//		}
//		tx, err := onceonly.Tx(ctx) // the final transaction: ledger row + key + job, one commit
//		if err != nil {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO ledger (order_id, charge_id) VALUES ($1, $2)`, args.OrderID, charge.ID)
//		return err
//	}, onceriver.Options[ChargeArgs]{})
//	river.AddWorker(workers, w)
//
// # The key
//
// The key comes from the args: they implement Keyed, or Options.Key picks
// it. It must name the logical message (the producer's message ID, the
// order ID), never the River job ID: a producer that inserts the message
// twice makes two jobs with two IDs. River's unique jobs
// (InsertOpts.UniqueOpts) do not replace it: they deduplicate only among the
// states and the period they name, and not at all once the job cleaner has
// deleted the first job. The args are the payload: the same key with other args cancels
// the job (onceonly.ErrKeyReused), so keep what differs between two
// deliveries of one message (a timestamp, a trace ID) out of the args (in
// the job's metadata, for instance).
//
// # What a job attempt becomes
//
// A first run runs the handler and commits its writes, the key's completion
// and river.JobCompleteTx in one transaction: no crash can leave the
// ledger written and the job still running, or the reverse. A duplicate job,
// or a rerun of one whose message is done, completes without running the
// handler. Every other answer is settled by onceonly.SettlePolicy
// (Options.Policy) and told to River in its verbs: a key held by a live run,
// or an execution handed off with a step's outcome unknown, snoozes the job
// (river.JobSnooze, which does not use up an attempt: neither is a failure),
// for at most a second while the key is in flight. The handler's errors go
// back to River, which retries on its RetryPolicy, until Policy.MaxFailures
// executions of the key failed: then the job is cancelled. A key reused with
// other args, or an invalid one, cancels the job. Postgres errors go back to
// River, which retries.
// The engine's Pool must reach the database holding River's tables (the
// driver is riverpgxv5): the job is completed in the engine's transaction.
//
// # Handlers with external effects: Handler and NewWorker
//
// Calls outside Postgres (a payment gateway, an email) run through
// onceonly.Step, each with a downstream key derived from (scope, key, step)
// that the called system deduplicates on; the business writes then go
// through onceonly.Tx. See docs/steps.md. A handler that only writes to
// Postgres can be a TxHandler (NewTxWorker), which is given the transaction.
//
// # Resumption
//
// A worker process killed after a step started leaves the key in progress
// and the River job running. Two things finish it: River's rescuer
// (Config.RescueStuckJobsAfter) makes the job available again, and the
// engine's Resume, run by any live process that created the Worker (which
// registers the handler under Options.Name), finishes the execution from
// its recorded steps once its lease has run out, even if River never runs
// the job again. So:
//
//   - run engine.Resume(ctx) in every process that works these jobs;
//   - set Config.RescueStuckJobsAfter to at least the engine's LeaseTimeout
//     (River's default is an hour): a rescued job then meets an expired
//     lease, or a resumption, instead of a live one;
//   - keep Config.JobTimeout (or Options.Timeout) below LeaseTimeout minus a
//     sixth, so River cancels a job before the engine stops its run.
//
// # Daemons
//
// The relay (cmd/relay) and the reconciler (cmd/reconciler) must run
// alongside the workers, as for every use of the engine: every transition
// of a key writes an outbox row, which only the relay deletes (once Redis
// holds the transition), and only the reconciler repairs Redis drift, reaps
// dead leases and expires old keys. Without them the outbox rows pile up
// and the key table keeps every key forever.
package onceriver
