-- purged_version: on a distributed database (Citus), the version of one
-- key past its expiry (a key just purged), or NULL: read apart from the
-- raise of the floor (raise_version_floor_to), since Citus refuses an
-- update of a reference table (the floor) that reads a distributed table
-- (raise_version_floor_key does both on one Postgres).
--
-- @scope   @key
SELECT max(version) FROM idempotency_keys
WHERE scope = @scope AND key = @key AND expires_at <= now()
