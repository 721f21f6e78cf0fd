-- record_step: records a recovery point of an execution the caller's owner
-- holds: a step's intent before its external call ($5 = '{}') or its
-- outcome after it ($5 = '{"outcome": …}'). The first intent also stores
-- the handler and request a resumption needs. Not a transition: no version
-- bump, no outbox event. No row changes when the owner no longer holds the
-- key (lease lost): the caller must not make the call.
--
-- $1 scope   $2 key   $3 owner (uuid)   $4 step name   $5 step record (jsonb)
-- $6 handler name   $7 request (bytea; NULL keeps the stored one)
-- $8 commit without waiting for the WAL flush (an outcome: losing it in a
--    crash costs one more call with the same downstream key)
UPDATE idempotency_keys SET
	steps = coalesce(steps, '{}'::jsonb) || jsonb_build_object($4::text, $5::jsonb),
	handler = $6, request = coalesce($7, request), updated_at = now()
WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 'in_progress'
RETURNING set_config('synchronous_commit', CASE WHEN $8 THEN 'off' ELSE current_setting('synchronous_commit') END, true)
