-- resume_claim: takes over up to @limit executions that started a step and
-- whose lease ran out (their holder died or handed off), for handlers this
-- engine knows (@handlers): in_progress under a new owner per key (@owners,
-- one per row taken), one version up, with an outbox event each. Rows other
-- transactions hold are skipped, and so are keys whose lock another
-- transaction holds (an execution of the key is under way). Returns what
-- the new holder continues with.
-- Each row's owner is picked in the CTE that finds it: Citus's deparser
-- crashes on an array subscript by another table's column in the SET list.
--
-- @lease (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @handlers: handler names (text[])   @limit   @owners (uuid[], at least @limit)
-- The and_scope markers: on a distributed database (Citus) the statement
--    runs scope by scope (@scope), on one shard (resumable_scopes finds the scopes);
--    on one Postgres they are left out.
WITH due AS (
	SELECT scope, key, (@owners::uuid[])[row_number() OVER ()] AS owner FROM (
		SELECT scope, key FROM idempotency_keys
		WHERE status = 'in_progress' AND lease_expires_at <= now() AND steps IS NOT NULL
			AND handler = ANY(@handlers::text[]) AND expires_at > now() {{and_scope}}
		ORDER BY lease_expires_at LIMIT @limit FOR UPDATE SKIP LOCKED
	) d
), locked AS MATERIALIZED (
	SELECT scope, key, owner FROM due WHERE {{try_key_lock onceonly_key_lock_id(scope,key)}}
), claimed AS (
	UPDATE idempotency_keys AS k SET
		version = k.version + 1, owner = due.owner,
		lease_expires_at = now() + @lease::interval, updated_at = now()
	FROM locked due WHERE k.scope = due.scope AND k.key = due.key {{and_scope k}}
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified,
	k.handler, k.request, k.steps
FROM claimed k
