-- resume_claim: takes over up to @limit executions that started a step and
-- whose lease ran out (their holder died or handed off), for handlers this
-- engine knows (@handlers): in_progress under a new owner per key (@owners,
-- one per row taken), one version up, with an outbox event each. Rows other
-- transactions hold are skipped. Returns what the new holder continues with.
--
-- @lease (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @handlers: handler names (text[])   @limit   @owners (uuid[], at least @limit)
WITH due AS (
	SELECT scope, key, row_number() OVER () AS n FROM (
		SELECT scope, key FROM idempotency_keys
		WHERE status = 'in_progress' AND lease_expires_at <= now() AND steps IS NOT NULL
			AND handler = ANY(@handlers::text[]) AND expires_at > now()
		ORDER BY lease_expires_at LIMIT @limit FOR UPDATE SKIP LOCKED
	) d
), claimed AS (
	UPDATE idempotency_keys AS k SET
		version = k.version + 1, owner = (@owners::uuid[])[due.n],
		lease_expires_at = now() + @lease::interval, updated_at = now()
	FROM due WHERE k.scope = due.scope AND k.key = due.key
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified,
	k.handler, k.request, k.steps
FROM claimed k
