-- lock_secret: the database's key lock secret, which every key's lock id
-- is derived from (see the key_locks migration). The engine reads it once.
SELECT secret FROM idempotency_lock_secret
