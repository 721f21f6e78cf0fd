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
-- Returns:
--   1 applied (written or deleted)
--   0 ignored: the cache holds this version or a newer one
local key, version, value, ttl = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])

local state, held_version, flag = decode(get(key))
if state ~= nil then
  if held_version > version then return 0 end
  if held_version == version and flag ~= 'p' then return 0 end
end

if value == '' or ttl <= 0 then
  redis.call('DEL', key)
  return 1
end
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  value = value .. (redis_now_ms() + tonumber(ARGV[4])) .. ':' .. ARGV[5]
end
redis.call('SET', key, value, 'PX', ttl)
return 1
