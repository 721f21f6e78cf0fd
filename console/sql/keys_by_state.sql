-- keys_by_state: the exact number of keys per state, live (unexpired) and
-- expired (waiting for retention). A full scan: only for small tables (see
-- keys_by_state_estimate).
SELECT status, count(*) FILTER (WHERE expires_at > now()), count(*) FILTER (WHERE expires_at <= now())
FROM idempotency_keys
GROUP BY status
