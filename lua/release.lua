-- release.lua: drops the caller's own provisional claim, for a request that
-- gave up before Postgres recorded it (Postgres unavailable, say). Owner-fenced:
-- a claim of another request, or one Postgres confirmed, is left alone.
--
-- KEYS[1] -> <prefix><scope>:<key>
-- ARGV[1] -> owner token of the caller (16 bytes)
-- Returns:
--   1 released
--   0 nothing to release
local state, _, flag, _, tail = decode(get(KEYS[1]))
if state ~= 'in_progress' or flag ~= 'p' then return 0 end
local c = string.find(tail, ':', 1, true)
if not c or string.sub(tail, c + 1) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
