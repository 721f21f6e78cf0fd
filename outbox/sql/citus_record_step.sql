-- citus_record_step: record_step on a distributed database (Citus), which
-- refuses set_config in a RETURNING clause (and would run it on the
-- worker's session): the same update, returning whether it changed the
-- row. An asynchronous commit is set by SET LOCAL statements sent before
-- it in its transaction (see Store.RecordStep).
--
-- @scope   @key   @owner (uuid)   @step   @record (jsonb)   @handler
-- @request (bytea; NULL keeps the stored one)
UPDATE idempotency_keys SET
	steps = coalesce(steps, '{}'::jsonb) || jsonb_build_object(@step::text, @record::jsonb),
	handler = @handler, request = coalesce(@request, request), updated_at = now()
WHERE scope = @scope AND key = @key AND owner = @owner AND status = 'in_progress'
RETURNING 'recorded'
