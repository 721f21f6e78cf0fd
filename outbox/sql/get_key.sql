-- get_key: reads the row of one key.
--
-- @scope   @key
SELECT {{key_columns}}
FROM idempotency_keys k
WHERE k.scope = @scope AND k.key = @key
