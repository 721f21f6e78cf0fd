-- decode.lua: prepended to every script (see lua.go); not run on its own.
--
-- Value layouts (one Redis string per idempotency key). Both begin with the
-- ASCII header <state>:<version>: an operator reads, then a flag byte:
--   state   in_progress | completed | failed (the words Postgres uses)
--   version the Postgres version the value reflects (decimal)
--
-- Layout 1, every state (written for in_progress and failed; completed
-- values written before layout 2 still decode):
--   <state>:<version>:<flag><fp8><tail>
--   flag    'p' provisional claim made by check.lua (in_progress only, never
--           outranks a Postgres version), 'c' confirmed by Postgres, 'm' completed
--           with the body kept in Postgres only (too large for the cache), 'h'
--           completed with stored headers (the tail's body starts with
--           <header bytes>\n<"Name: value" lines>)
--   fp8     first 8 bytes of SHA-256 of the request fingerprint; the first 6
--           are compared
--   tail    in_progress: <lease_until_ms>:<owner16>  (lease in Redis TIME)
--           completed:   <status, 3 digits><content type>\n<body>
--                        (empty content type means application/json, "-" none)
--           failed:      empty
--
-- Layout 2, completed only, packed to fit a 200-byte body in the jemalloc
-- size class of a bare SET of it (issue 16):
--   completed:<version>:<flag><fp6><status low byte><tail>
--   flag    a byte >= 0x80 (never an ASCII letter): bits 5-6 are
--           (status - 100) >> 8, bit 4 a header block, bits 2-3 the content
--           type (0 application/json, 1 none, 2 text/plain; charset=utf-8,
--           3 written in the tail), bits 0-1 the body (0 in the tail, 1 kept
--           in Postgres only: nothing follows the status, 2 in the tail
--           deflated: <uvarint length><deflate stream>, for bodies of 512
--           bytes or more that shrink by an eighth)
--   fp6     first 6 bytes of SHA-256 of the request fingerprint (another
--           payload matches by chance once in 2^48; Postgres keeps the whole)
--   status  (status - 100) & 0xff
--   tail    [<uvarint n><content type>] [<header block>] <body>
--           header block: <uvarint count>, then per value a name code (one
--           byte: 1.. the common names listed in cache/codec.go, 0 the name
--           follows as <uvarint n><name>), then <uvarint n><value>
--
-- decode returns state, version, flag, fp6 (the compared digest) and the
-- index where the tail starts (the tail is not copied: for a completed key
-- it holds the body), or nil for anything that is not such a value (a
-- foreign or corrupt value counts as a miss).
local function decode(v)
  if type(v) ~= 'string' then return nil end
  local a = string.find(v, ':', 1, true)
  if not a then return nil end
  local b = string.find(v, ':', a + 1, true)
  if not b then return nil end
  local state = string.sub(v, 1, a - 1)
  if state ~= 'in_progress' and state ~= 'completed' and state ~= 'failed' then return nil end
  local version = tonumber(string.sub(v, a + 1, b - 1))
  if version == nil then return nil end
  local flag = string.byte(v, b + 1)
  if state == 'completed' and flag ~= nil and flag >= 128 then
    if #v < b + 8 then return nil end
    return state, version, string.sub(v, b + 1, b + 1), string.sub(v, b + 2, b + 7), b + 9
  end
  if #v < b + 9 then return nil end
  return state, version, string.sub(v, b + 1, b + 1), string.sub(v, b + 2, b + 7), b + 10
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
