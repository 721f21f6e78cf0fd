-- batch_probe: the rows the keys of a batch have, read behind batch_begin
-- once their locks are held: its snapshot sees every row committed before
-- the locks were taken. A key with no row here runs in the batch; a key
-- with a row is answered from it (a replay, a reused key) or runs alone.
--
-- @scopes   @keys: one per key
SELECT {{key_columns}}
FROM unnest(@scopes::text[], @keys::text[]) AS i (scope, key)
	JOIN idempotency_keys k ON k.scope = i.scope AND k.key = i.key
