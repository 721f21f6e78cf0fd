-- wrk script: every request replays one completed key (the same
-- Idempotency-Key and body), so the api answers from the Redis cache.
wrk.method = "POST"
wrk.body = '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk_test_demo"
wrk.headers["Idempotency-Key"] = "bench-replay-" .. (os.getenv("BENCH_RUN") or "0")
