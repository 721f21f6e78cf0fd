-- citus_single_probe: single_begin's row probe on a distributed database
-- (Citus), sent behind citus_single_begin: whether the key has a row, and
-- the version floor. It names the key's scope, so it runs on the shard's
-- worker, where the floor (a reference table) has a copy: one snapshot
-- reads both.
--
-- The floor is read here so that citus_single_finish and citus_claim_insert
-- can insert VALUES: a subquery inside their INSERT makes Citus plan it as
-- INSERT … SELECT pulled through the coordinator (intermediate results,
-- several round trips: 9-14 ms a statement, measured). Read no earlier than
-- the probe, it keeps versions from repeating as the floor inside the
-- INSERT does: retention commits the floor's raise before it deletes a key
-- (raise_version_floor, raise_version_floor_to), so a probe that finds no
-- row, in this one snapshot, sees the floor raised past every version the
-- key had.
--
-- @scope   @key
SELECT EXISTS (SELECT FROM idempotency_keys WHERE scope = @scope AND key = @key) AS has_row,
	coalesce((SELECT version FROM idempotency_version_floor), 0) AS floor
