-- raise_version_floor: raises the version floor to the highest version of
-- the next @limit keys past their expiry, the batch delete_expired takes
-- next. It commits before that delete runs, so a claim that inserts a
-- deleted key again (claim_insert, floor + 1) reads the raised floor: to
-- read the old one it would have to have started before this commit and
-- still be running after the delete.
--
-- @limit
UPDATE idempotency_version_floor AS f SET version = batch.version
FROM (
	SELECT max(version) AS version FROM (
		SELECT version FROM idempotency_keys WHERE expires_at <= now()
		ORDER BY expires_at LIMIT @limit
	) expired
) batch
WHERE batch.version > f.version
