-- single_begin: opens a single-commit execution (the engine's SingleCommit
-- mode), sent with the BEGIN of its transaction. It takes the key's
-- transaction-scoped advisory lock without waiting, so a duplicate in
-- flight is turned away (I4); bounds the transaction by the lease: Postgres
-- ends a statement that runs, or a transaction that idles, longer than it,
-- so a stuck or dead holder blocks the key no longer than the lease (I5;
-- session_keepalives.sql, sent once per connection, finds a client host
-- that died sooner); and tells whether the key has a row, which the
-- two-phase path then handles (replay, conflict, takeover). The lock, the
-- limits and the transaction end together.
--
-- @scope   @key   @lease_ms: the lease (milliseconds, as text)
SELECT pg_try_advisory_xact_lock(hashtextextended(@scope || ':' || @key, 0)) AS locked,
	EXISTS (SELECT FROM idempotency_keys WHERE scope = @scope AND key = @key) AS has_row,
	set_config('statement_timeout', @lease_ms, true),
	set_config('idle_in_transaction_session_timeout', @lease_ms, true)
