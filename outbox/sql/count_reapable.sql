-- count_reapable: counts the keys reap_leases would reap.
--
-- @grace (interval)
SELECT count(*) FROM idempotency_keys
WHERE status = 'in_progress' AND lease_expires_at < now() - @grace::interval AND steps IS NULL
