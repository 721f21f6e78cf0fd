-- heartbeat: extends the lease of a key the caller's owner holds to $4
-- from now. Not a transition: no version bump, no outbox event. No row
-- changes when the owner no longer holds the key (lease lost), nor when the
-- lease ran out before the heartbeat arrived (it never revives one).
--
-- $1 scope   $2 key   $3 owner (uuid)   $4 lease (interval)
UPDATE idempotency_keys SET lease_expires_at = now() + $4::interval
WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 'in_progress' AND lease_expires_at > now()
