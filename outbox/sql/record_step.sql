-- record_step: records a recovery point of an execution the caller's owner
-- holds: a step's intent before its external call (@record = '{}') or its
-- outcome after it (@record = '{"outcome": …}'). The first intent also
-- stores the handler and request a resumption needs. Not a transition: no
-- version bump, no outbox event. No row changes when the owner no longer
-- holds the key (lease lost): the caller must not make the call.
--
-- @scope   @key   @owner (uuid)   @step: the step's name
-- @record: the step's record (jsonb)   @handler: the handler's name
-- @request (bytea; NULL keeps the stored one)
-- @async_commit: commit without waiting for the WAL flush (an outcome:
--    losing it in a crash costs one more call with the same downstream key)
UPDATE idempotency_keys SET
	steps = coalesce(steps, '{}'::jsonb) || jsonb_build_object(@step::text, @record::jsonb),
	handler = @handler, request = coalesce(@request, request), updated_at = now()
WHERE scope = @scope AND key = @key AND owner = @owner AND status = 'in_progress'
RETURNING set_config('synchronous_commit', CASE WHEN @async_commit THEN 'off' ELSE current_setting('synchronous_commit') END, true)
