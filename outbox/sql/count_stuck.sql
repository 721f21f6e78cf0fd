-- count_stuck: counts the executions in progress that started a step and
-- whose lease ran out more than @grace ago: a live engine's resumer takes
-- such a key over within its RESUME_INTERVAL, so one still there is stuck
-- (no process registers its handler, or none runs Resume). The reaper leaves
-- them alone (reap_leases): they may have reached an external system.
--
-- @grace (interval)
SELECT count(*) FROM idempotency_keys
WHERE status = 'in_progress' AND lease_expires_at < now() - @grace::interval AND steps IS NOT NULL
