-- executions: the keys in progress, those whose lease ran out with a step
-- started (awaiting a resumption by a live engine) or without one (awaiting
-- the reaper), the longest a lease has been over, and the longest one
-- with a step started has (a stuck execution's). It reads the leases
-- in the order they end, through the partial index on leases, and stops
-- after @cap: the leases that ran out come first, so their counts are
-- exact unless @cap of them ran out.
--
-- @cap
SELECT count(*), count(*) FILTER (WHERE over AND stepped), count(*) FILTER (WHERE over AND NOT stepped),
	coalesce(max(over_ms), 0), coalesce(max(over_ms) FILTER (WHERE over AND stepped), 0)
FROM (
	SELECT lease_expires_at <= now() AS over, steps IS NOT NULL AS stepped,
		(extract(epoch FROM now() - lease_expires_at) * 1000)::bigint AS over_ms
	FROM idempotency_keys WHERE status = 'in_progress'
	ORDER BY lease_expires_at
	LIMIT @cap::bigint
) held
