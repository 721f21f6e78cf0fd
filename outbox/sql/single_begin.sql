-- single_begin: opens a single-commit execution (the engine's default
-- mode), sent with the BEGIN of its transaction. It takes the key's lock
-- (its transaction-scoped advisory lock, class 1330529093 and the key's
-- keyed id: see the key_locks migration) without waiting, so a duplicate
-- in flight, of any mode, is turned away (I4); and bounds the transaction
-- by the lease: Postgres ends a statement that runs, or a transaction that
-- idles, longer than it, so a stuck or dead holder blocks the key no
-- longer than the lease (I5; session_keepalives.sql, sent once per
-- connection, finds a client host that died sooner). The lock, the limits
-- and the transaction end together.
--
-- Whether the key has a row is read by the next statement (single_probe),
-- in the same round trip: a statement's snapshot is taken before its
-- functions run, so a probe in this statement could miss a row committed
-- between the two and run a handler on a completed key.
-- The statement reads no table: on a distributed database (Citus) it runs
-- on the coordinator, whose lock and limits the client's transaction are.
--
-- @lock_id (integer)   @lease_ms: the lease (milliseconds, as text)
SELECT pg_try_advisory_xact_lock(1330529093, @lock_id::integer) AS locked,
	set_config('statement_timeout', @lease_ms, true),
	set_config('idle_in_transaction_session_timeout', @lease_ms, true)
