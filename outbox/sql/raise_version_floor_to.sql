-- raise_version_floor_to: raises the version floor to @version (a purged
-- key's, purged_version), on a distributed database (Citus). It commits
-- before delete_key runs, as raise_version_floor_key does; a key claimed
-- again in between is live, and delete_key leaves it.
--
-- @version (bigint)
UPDATE idempotency_version_floor SET version = @version::bigint
WHERE version < @version::bigint
