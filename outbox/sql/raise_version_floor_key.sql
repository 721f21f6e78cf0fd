-- raise_version_floor_key: raises the version floor to the version of one
-- key past its expiry (a key just purged), ahead of delete_key. It commits
-- before that delete runs, for the reason raise_version_floor gives: a claim
-- that inserts the key again (claim_insert, floor + 1) then reads the raised
-- floor. A key that is live again (claimed since its purge) raises nothing.
--
-- @scope   @key
UPDATE idempotency_version_floor AS f SET version = purged.version
FROM (
	SELECT max(version) AS version FROM idempotency_keys
	WHERE scope = @scope AND key = @key AND expires_at <= now()
) purged
WHERE purged.version > f.version
