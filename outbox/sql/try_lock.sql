-- try_lock: takes the advisory lock @lock_key for the caller's transaction,
-- if no other session holds it, without waiting. It ends with the
-- transaction, so it never stays behind on a pooled server connection
-- (PgBouncer in transaction mode hands the connection to another client
-- after each transaction). The transaction may sit idle while its holder
-- works on other connections: idle_in_transaction_session_timeout is lifted
-- for it. On Citus the statement reads no table, so it runs on the node
-- the client is connected to: the coordinator's lock, which serialises
-- the callers that all connect to the coordinator (DESIGN §5).
--
-- @lock_key (bigint)
SELECT pg_try_advisory_xact_lock(@lock_key::bigint) AS locked,
	set_config('idle_in_transaction_session_timeout', '0', true)
