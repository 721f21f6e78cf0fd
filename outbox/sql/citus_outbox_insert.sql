-- citus_outbox_insert: the outbox event of a key's version, on a
-- distributed database (Citus), sent behind citus_single_finish or
-- citus_claim_insert in the same transaction (their outbox CTE would not
-- route to one shard). VALUES naming the scope: it runs on the key's shard.
-- It runs only when the insert before it succeeded: a failed statement
-- makes Postgres skip the rest of the batch.
--
-- @scope   @key   @version (bigint)
INSERT INTO outbox (scope, key, version) VALUES (@scope, @key, @version::bigint)
