-- batch_begin: opens an exactly-once batch (Engine.DoBatch), sent with the
-- BEGIN of its transaction: it takes every key's lock — the same
-- transaction-scoped advisory lock a single-commit execution takes
-- (single_begin), class 1330529093 and the key's keyed id — without
-- waiting, one key after the other in the order given (the engine sorts
-- the ids, so two batches always try them in one order), and bounds the
-- transaction by the lease as single_begin does. A key whose lock another
-- transaction holds has an execution under way, of any mode: it comes back
-- false and the batch leaves it out (no concurrent execution).
--
-- Whether the keys have rows is read by the next statement (batch_probe),
-- in the same round trip, once the locks are held: a statement's snapshot
-- is taken before its functions run.
--
-- @lock_ids (integer[], in the order to take them)
-- @lease_ms: the lease (milliseconds, as text)
SELECT array_agg(l.locked ORDER BY l.n) AS locked,
	set_config('statement_timeout', @lease_ms, true),
	set_config('idle_in_transaction_session_timeout', @lease_ms, true)
FROM (
	SELECT i.n, {{try_key_lock i.id}} AS locked
	FROM unnest(@lock_ids::integer[]) WITH ORDINALITY AS i (id, n)
	ORDER BY i.n
) AS l
