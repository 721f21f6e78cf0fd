-- wrk script: every request carries a new Idempotency-Key, so each one is a
-- first execution (claim, payment insert, complete, outbox, write-through).
-- With BENCH_TENANTS=N the requests go round N merchants, API keys
-- sk_bench0 … sk_benchN-1 (the api runs with API_KEYS=sk_bench0=acct_bench0,…;
-- bench/citus.sh: on Citus the merchant is the scope, so their keys lie on
-- several shards); unset, every request is the demo merchant's.
local run = os.getenv("BENCH_RUN") or tostring(os.time())
local tenants = tonumber(os.getenv("BENCH_TENANTS") or "0")
local counter = 0
local thread_id = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

request = function()
  counter = counter + 1
  local key = "bench-" .. run .. "-" .. tid .. "-" .. counter
  local auth = "Bearer sk_test_demo"
  if tenants > 0 then
    auth = "Bearer sk_bench" .. (counter % tenants)
  end
  return wrk.format("POST", "/v1/payments", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = auth,
    ["Idempotency-Key"] = key,
  }, '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}')
end

done = function(summary, latency, requests)
  io.write(string.format("non-2xx/3xx: %d\n", summary.errors.status))
end
