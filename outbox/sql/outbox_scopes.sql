-- outbox_scopes: on a distributed database (Citus), the scopes of the
-- oldest @limit unparked events, found by one read of every shard (no
-- lock): the relay then takes their events scope by scope (take_batch), on
-- one shard each, with FOR UPDATE SKIP LOCKED and ctid inside that shard.
--
-- @limit
SELECT DISTINCT scope FROM (
	SELECT scope FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT @limit
) oldest
