-- steps_in_progress: the recorded steps of those given keys that are in
-- progress, one row per step: its name, and whether its outcome is
-- recorded (settled) or only its intent (its call is in flight, or its
-- outcome unknown). The reconciler names them when it finds such a key
-- stale in Redis. Not a transition.
--
-- @scopes (text[])   @keys (text[], same length)
SELECT k.scope, k.key, s.name, s.record ? 'outcome' AS settled
FROM unnest(@scopes::text[], @keys::text[]) AS r(scope, key)
JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key
CROSS JOIN LATERAL jsonb_each(k.steps) AS s(name, record)
WHERE k.status = 'in_progress'
ORDER BY k.scope, k.key, s.name
