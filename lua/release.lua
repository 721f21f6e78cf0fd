-- release.lua: drops the caller's own provisional claim, for a request that
-- gave up before Postgres recorded it (Postgres unavailable, say). Owner-fenced:
-- a claim of another request, or one Postgres confirmed, is left alone.
--
-- KEYS[1] -> <prefix><scope>:<key>
-- ARGV[1] -> owner token of the caller (16 bytes)
-- Returns:
--   1 released
--   0 nothing to release
local value = get(KEYS[1])
local state, _, flag, _, t = decode(value)
if state ~= 'in_progress' or flag ~= 'p' then return 0 end
if lease_owner(value, t) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
