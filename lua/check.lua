-- check.lua: the api's one round trip. Answers a replay, a conflict or a reuse
-- from the cache, or records a provisional claim and lets the caller go on to
-- claim the key in Postgres (which stays the judge).
--
-- KEYS[1] -> <prefix><scope>:<key>
-- ARGV[1] -> fingerprint digest (8 bytes: a claim stores them, the first 6
--            are compared)
-- ARGV[2] -> owner token of the caller (16 bytes)
-- ARGV[3] -> lease in milliseconds
-- Returns:
--   {0}                  claimed: the caller claims the key in Postgres
--   {1, value}           completed with this fingerprint: the encoded value
--   {2, retry_after_ms}  in progress under a live lease
--   {3}                  the key belongs to another fingerprint
-- TIME is read only when a lease is involved: a replay needs no clock.
local key, fp, owner, lease_ms = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local fp6 = string.sub(fp, 1, 6)

local function claim(version, now)
  redis.call('SET', key,
    'in_progress:' .. version .. ':p' .. fp .. ((now or redis_now_ms()) + lease_ms) .. ':' .. owner,
    'PX', lease_ms)
  return {0}
end

local value = get(key)
local state, version, flag, held_fp, t = decode(value)
if state == nil then
  return claim(0)
end

if state == 'in_progress' then
  if flag == 'p' and string.sub(value, -16) == owner then
    -- The caller's own provisional claim: this check ran before, and its
    -- reply was lost (a client retries a command whose reply timed out).
    return {0}
  end
  local now = redis_now_ms()
  local remaining = lease_until(value, t) - now
  if held_fp ~= fp6 and flag ~= 'p' then
    return {3}
  end
  if remaining > 0 then
    -- A provisional claim of another payload is not proof of reuse: Postgres
    -- may hold this payload's key, so the caller retries instead of a 422.
    return {2, remaining}
  end
  return claim(version, now)
end

if held_fp ~= fp6 then
  return {3}
end
if state == 'completed' then
  return {1, value}
end
-- failed: retryable, the next request claims it again.
return claim(version)
