-- key_detail: what the key page shows of a row beyond Engine.Inspect: its
-- times (the database's clock), the handler and request a resumption would
-- continue with, and the recovery points of its steps.
--
-- @scope   @key
SELECT k.created_at, k.updated_at, k.lease_expires_at, k.expires_at, now() AS db_now,
	coalesce(k.handler, ''), k.request, coalesce(k.steps::text, ''),
	coalesce(k.response_content_type, ''), coalesce(octet_length(k.response_body), 0)
FROM idempotency_keys k
WHERE k.scope = @scope AND k.key = @key
