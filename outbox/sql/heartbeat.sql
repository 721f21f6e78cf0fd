-- heartbeat: extends the lease of a key the caller's owner holds to @lease
-- from now. Not a transition: no version bump, no outbox event. No row
-- changes when the owner no longer holds the key (lease lost), nor when the
-- lease ran out before the heartbeat arrived (it never revives one).
--
-- @scope   @key   @owner (uuid)   @lease (interval)
UPDATE idempotency_keys SET lease_expires_at = now() + @lease::interval
WHERE scope = @scope AND key = @key AND owner = @owner AND status = 'in_progress' AND lease_expires_at > now()
