-- wrk script: every request carries a new Idempotency-Key, so each one is a
-- first execution (claim, payment insert, complete, outbox, write-through).
local run = os.getenv("BENCH_RUN") or tostring(os.time())
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
  return wrk.format("POST", "/v1/payments", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer sk_test_demo",
    ["Idempotency-Key"] = key,
  }, '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}')
end

done = function(summary, latency, requests)
  io.write(string.format("non-2xx/3xx: %d\n", summary.errors.status))
end
