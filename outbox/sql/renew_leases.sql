-- renew_leases: the engine's heartbeat: extends every lease it holds to
-- @lease from now, in one statement on a connection of its own (never one a
-- handler waits for). Returns the leases still held; a lease missing from
-- the answer was taken over or reaped, or ran out before the renewal
-- arrived: a renewal late off the network (sent before a partition,
-- delivered after it) never revives a lease its holder stopped under. Not
-- a transition: no version bump, no outbox event.
--
-- @scopes (text[])   @keys (text[])   @owners (uuid[], same length)
-- @lease (interval)
-- The and_scope marker: on a distributed database (Citus) the statement
--    renews one scope's leases (@scope), on one shard, and the engine
--    sends one per scope, each in a transaction of its own; on one
--    Postgres it is left out.
UPDATE idempotency_keys AS k SET lease_expires_at = now() + @lease::interval
FROM unnest(@scopes::text[], @keys::text[], @owners::uuid[]) AS l(scope, key, owner)
WHERE k.scope = l.scope AND k.key = l.key AND k.owner = l.owner AND k.status = 'in_progress' {{and_scope k}}
	AND k.lease_expires_at > now()
RETURNING k.owner
