-- decode.lua: prepended to every script (see lua.go); not run on its own.
--
-- Value layout (one Redis string per idempotency key):
--   <state>:<version>:<flag><fp8><tail>
--   state   in_progress | completed | failed (the words Postgres uses)
--   version the Postgres version the value reflects (decimal)
--   flag    'p' provisional claim made by check.lua (in_progress only, never
--           outranks a Postgres version), 'c' confirmed by Postgres, 'm' completed
--           with the body kept in Postgres only (too large for the cache), 'h'
--           completed with stored headers (the tail's body starts with
--           <header bytes>\n<"Name: value" lines>)
--   fp8     first 8 bytes of SHA-256 of the request fingerprint (another
--           payload matches by chance once in 2^64; Postgres keeps the whole)
--   tail    in_progress: <lease_until_ms>:<owner16>  (lease in Redis TIME)
--           completed:   <status, 3 digits><content type>\n<body>
--                        (empty content type means application/json, "-" none)
--           failed:      empty
--
-- decode returns state, version, flag, fp8 and the index where the tail
-- starts (the tail is not copied: for a completed key it holds the body), or
-- nil for anything that is not such a value (a foreign or corrupt value
-- counts as a miss).
local function decode(v)
  if type(v) ~= 'string' then return nil end
  local a = string.find(v, ':', 1, true)
  if not a then return nil end
  local b = string.find(v, ':', a + 1, true)
  if not b then return nil end
  local state = string.sub(v, 1, a - 1)
  if state ~= 'in_progress' and state ~= 'completed' and state ~= 'failed' then return nil end
  local version = tonumber(string.sub(v, a + 1, b - 1))
  if version == nil or #v < b + 9 then return nil end
  return state, version, string.sub(v, b + 1, b + 1), string.sub(v, b + 2, b + 9), b + 10
end

-- lease_until returns the lease deadline (Redis ms) of an in_progress value
-- v whose tail starts at t.
local function lease_until(v, t)
  local c = string.find(v, ':', t, true)
  if not c then return 0 end
  return tonumber(string.sub(v, t, c - 1)) or 0
end

-- lease_owner returns the owner token of an in_progress value v whose tail
-- starts at t.
local function lease_owner(v, t)
  local c = string.find(v, ':', t, true)
  if not c then return nil end
  return string.sub(v, c + 1)
end

-- redis_now_ms is the Redis server's clock in milliseconds.
local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- get returns the key's string value, or nil when it is absent or not a string.
local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' then return nil end
  return v
end
