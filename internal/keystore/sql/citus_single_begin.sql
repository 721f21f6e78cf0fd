-- citus_single_begin: single_begin on a distributed database (Citus), on
-- the coordinator: the key's advisory lock and the transaction's limits
-- by lease, as single_begin takes and sets them (see there). A statement
-- that reads a distributed table runs on the shard's worker, and with it
-- its functions: the lock and limits would hold the worker's session, not
-- the coordinator's that the client's transaction is. This one reads no
-- table, so it runs on the coordinator; the engine reads whether the key
-- has a row with get_key, in the same round trip.
--
-- @scope   @key   @lease_ms: the lease (milliseconds, as text)
SELECT pg_try_advisory_xact_lock(hashtextextended(@scope || ':' || @key, 0)) AS locked,
	set_config('statement_timeout', @lease_ms, true),
	set_config('idle_in_transaction_session_timeout', @lease_ms, true)
