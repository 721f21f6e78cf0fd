-- finish: moves a key the caller's owner holds to completed (with the
-- response) or failed, one version up, with its outbox event; the request
-- kept for resumption is dropped, the steps stay for the record. Completing
-- runs inside the caller's business transaction, so both commit together.
-- When the owner no longer holds the key (lease lost), no row comes back —
-- or, with $11, the statement fails (onceonly_lease_lost, SQLSTATE OO001):
-- the engine sends its COMMIT in the same round trip, and Postgres skips a
-- COMMIT that follows a failed statement.
--
-- $1 scope   $2 key   $3 owner (uuid)   $4 status ('completed' | 'failed')
-- $5 response status   $6 response content type   $7 response body
-- $10 response headers (keystate.EncodeHeader)
-- $8 how long the row lives from now (interval)
-- $9 notify the relays in this statement's transaction
-- $11 fail instead of returning no row
WITH finished AS (
	UPDATE idempotency_keys AS k SET
		status = $4, version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		response_status = $5, response_content_type = $6, response_body = $7, response_headers = $10,
		request = NULL,
		expires_at = now() + $8::interval, updated_at = now()
	WHERE k.scope = $1 AND k.key = $2 AND k.owner = $3 AND k.status = 'in_progress'
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM finished
)
SELECT k.scope, k.key, k.status, k.version, k.fingerprint,
	'00000000-0000-0000-0000-000000000000'::uuid AS owner, 0::bigint AS lease_ms,
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), coalesce(k.response_headers, ''), k.response_body, false AS body_omitted,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_ms,
	(CASE WHEN $9 THEN pg_notify('onceonly_outbox', '') END) IS NULL AS notified
FROM (VALUES (true)) AS one (row)
	LEFT JOIN finished k ON true
WHERE CASE WHEN k.scope IS NOT NULL THEN true WHEN $11 THEN onceonly_lease_lost($1, $2) ELSE false END
