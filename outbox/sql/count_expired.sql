-- count_expired: counts the keys delete_expired would delete.
SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()
