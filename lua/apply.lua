-- apply.lua: writes a Postgres state into the cache unless the cache already
-- holds that version or a newer one. Used by the relay, the reconciler and the
-- engine's write-through; duplicate and out-of-order deliveries are harmless.
--
-- KEYS[1] -> <prefix><scope>:<key>
-- ARGV[1] -> Postgres version
-- ARGV[2] -> encoded value; for in_progress without the tail, which is built
--            here from ARGV[4] and ARGV[5]. Empty: the key is gone from
--            Postgres and is deleted from the cache.
-- ARGV[3] -> time to live in milliseconds (from the Postgres expiry)
-- ARGV[4] -> in_progress only: lease remaining in milliseconds
-- ARGV[5] -> in_progress only: owner token (16 bytes)
-- ARGV[6] -> optional, the reconciler's compare-and-set: the value is written
--            only if the held value still starts with these bytes (what the
--            reconciler saw), or, for '!absent', only if there is no key;
--            versions are not compared then. A provisional claim under a
--            live lease (a request in flight) is never overwritten this way.
-- A key in progress that settles or goes is announced on its own sharded
-- channel (SPUBLISH to KEYS[1], which stays on the key's shard), so
-- requests waiting for it (MiddlewareOptions.Wait) ask again at once.
-- Returns:
--   1 applied (written or deleted)
--   0 ignored: the cache holds this version or a newer one, or the
--     compare-and-set did not match
local key, version, value, ttl = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local expect = ARGV[6] or ''

local held = get(key)
local state, held_version, flag, _, t = decode(held)
if expect == '!absent' then
  if redis.call('EXISTS', key) == 1 then return 0 end
elseif expect ~= '' then
  if held == nil or string.sub(held, 1, #expect) ~= expect then return 0 end
  if flag == 'p' and lease_until(held, t) > redis_now_ms() then return 0 end
elseif state ~= nil then
  if held_version > version then return 0 end
  if held_version == version and flag ~= 'p' then return 0 end
end

local settles = ARGV[4] == nil or ARGV[4] == ''
if value == '' or ttl <= 0 then
  redis.call('DEL', key)
elseif settles then
  redis.call('SET', key, value, 'PX', ttl)
else
  value = value .. (redis_now_ms() + tonumber(ARGV[4])) .. ':' .. ARGV[5]
  redis.call('SET', key, value, 'PX', ttl)
end
if state == 'in_progress' and settles then
  -- pcall: before Redis 7 there is no SPUBLISH, and waiters poll instead.
  redis.pcall('SPUBLISH', key, '')
end
return 1
