# onceonly — the commands that matter. See README.md.
.PHONY: test test-citus lint tidy publish-check release run stop services services-stop build fuzz bench bench-relay bench-reconcile bench-compare bench-scale bench-citus docs tour chaos chaos-consumer chaos-history console-screenshots

# Runs every test with -race on local Postgres and Redis (started and
# installed as needed).
test:
	scripts/test.sh

# go vet, golangci-lint (pinned; built once into ~/.cache/onceonly/tools) and
# gofmt. Not part of `make test`; CI runs both.
lint:
	scripts/lint.sh

# go mod tidy in every module, against the tree published at the version
# the modules require one another at (docs/development.md).
tidy:
	scripts/tidy.sh

# The modules publish as tags would (scripts/test.sh runs it too).
publish-check:
	scripts/publish-check.sh

# Every module at VERSION in lockstep: requirements, commit, tags
# (docs/development.md, "Releasing"). Pushes nothing.
release:
	scripts/release.sh $(VERSION)

# The Citus tests (citus/): `api migrate up` distributes the tables, the
# tour, a short chaos run and relay/reconciler --once on the Citus cluster
# whose coordinator TEST_CITUS_URL names (docs/citus.md: scripts/citus.sh
# build, then scripts/citus.sh start .data/citus 61810). Not part of
# `make test`: without TEST_CITUS_URL it fails and says what it needs.
test-citus:
	scripts/test-citus.sh

# Runs the whole system on local Postgres and Redis: migrations, then the api
# on :8080, the relay, the reconciler, the gateway and the demo's message
# consumer (:8084) on NATS JetStream; `make run BROKER=rabbitmq` runs the
# consumer on RabbitMQ instead. The broker is installed and started as needed.
# BROKER=kafka and BROKER=sqs run it on stand-ins built from this workspace
# (franz-go's kfake on :9092, goaws behind a JSON front on :9324), not on
# Kafka or SQS themselves (docs/running.md).
BROKER ?= nats
run:
	BROKER=$(BROKER) scripts/run.sh

# Stops what `make run` started, from another terminal: its daemons, then the
# servers it started (as Ctrl-C does); also after a run killed outright.
stop:
	scripts/run.sh stop

# Starts the local development servers only (Postgres :5432, Redis :6379,
# nats-server with JetStream :4222).
services:
	scripts/services.sh start .data/dev $${PG_PORT:-5432} $${REDIS_PORT:-6379}
	scripts/services.sh nats .data/dev $${NATS_PORT:-4222}

services-stop:
	scripts/services.sh stop .data/dev

build:
	mkdir -p bin
	go build -o bin/ ./cmd/...

# Longer fuzzing than the seed-corpus runs the tests do.
# The api end to end, one million executions (FUZZ_EXECS), then the
# engine's own targets; CI runs a short FuzzAPI smoke in scripts/test.sh.
fuzz:
	scripts/fuzz.sh

# Every figure of docs/BENCHMARKS.md that one machine can make: the
# side-by-side comparison (with its ratios and open-loop latencies), the
# relay and the reconciler. CI runs a one-second smoke of bench-compare.
bench: bench-compare bench-relay bench-reconcile

# Relay drain rate and commit→Redis lag beside redis-benchmark and pgbench
# baselines, on durable servers (see docs/BENCHMARKS.md).
bench-relay:
	bench/relay.sh

# A reconcile pass over 100k and 1M keys beside a bare SCAN, with peak RSS
# (BENCH_REDIS=cluster: on a three-master Redis Cluster).
bench-reconcile:
	bench/reconcile.sh

# The side-by-side benchmark: bare Redis GET, bare INSERT, Redis-only and
# Postgres-only idempotency and onceonly under one load generator, duplicate
# effects under a cache flush, Redis memory per key, and the SQL ceiling of a
# first execution (bench/sqlceiling.sh: pgbench of the engine's statements;
# SQLCEILING_LADDER=1 adds leaner schemas) (BENCH_SECONDS, BENCH_CONNS,
# BENCH_PROFILE; see docs/BENCHMARKS.md).
bench-compare:
	bench/compare.sh

# Scale-out: relay drain with one relay vs two, api throughput with one api
# process vs two, on a single Redis and on a three-master Redis Cluster
# (BENCH_EVENTS, BENCH_SECONDS, BENCH_CONNS; see docs/scaling.md).
bench-scale:
	bench/scale.sh

# onceonly on Citus beside plain Postgres, same machine: relay drain and
# first executions through the api (one merchant and several), with the
# ratios (BENCH_EVENTS, BENCH_SECONDS, BENCH_CONNS, BENCH_TENANTS; needs
# Citus built: scripts/citus.sh build; see docs/citus.md).
bench-citus:
	bench/citus.sh

# Retakes the console's screenshots in docs/images/ (headless Chromium,
# installed when missing).
console-screenshots:
	scripts/console-screenshots.sh

# Regenerates docs/configuration.md from the commands' -h output.
docs:
	scripts/config-doc.sh

# Walks through every behaviour against the stack `make run` started (same
# ports and URLs, and the same BROKER; the crash step starts and kills a
# second api, the message step publishes through bin/consumer publish).
tour:
	mkdir -p bin && go build -o bin/ ./cmd/api ./cmd/gateway ./cmd/consumer ./demo/tour
	DATABASE_URL="$${DATABASE_URL:-postgres://postgres@127.0.0.1:$${PG_PORT:-5432}/onceonly?sslmode=disable}" \
	REDIS_URL="$${REDIS_URL:-redis://127.0.0.1:$${REDIS_PORT:-6379}/0}" \
	BROKER_URL="$${BROKER_URL:-$$(case "$(BROKER)" in rabbitmq) echo amqp://guest:guest@127.0.0.1:$${AMQP_PORT:-5672}/ ;; kafka) echo kafka://127.0.0.1:$${KAFKA_PORT:-9092} ;; sqs) echo sqs://127.0.0.1:$${SQS_PORT:-9324} ;; *) echo nats://127.0.0.1:$${NATS_PORT:-4222} ;; esac)}" \
	TOUR_CONSUMER="$${TOUR_CONSUMER:-http://localhost$${CONSUMER_HTTP_ADDR:-:8084}}" \
	TOUR_API="$${TOUR_API:-http://localhost$${HTTP_ADDR:-:8080}}" \
	TOUR_GATEWAY_URL="$${TOUR_GATEWAY_URL:-http://127.0.0.1:$$(gw=$${GATEWAY_HTTP_ADDR:-:8083}; echo $${gw##*:})}" bin/tour

# The chaos suite at length: CHAOS_DURATION (default 5m) of load and faults
# on a private stack, once on a single Redis and once on a Redis Cluster
# (CHAOS_REDIS=single|cluster for one); then the demo consumer's, once per
# broker, over CHAOS_MESSAGES (default 2500) messages (CHAOS_BROKER=nats|rabbitmq
# for one; kafka and sqs only when named: make chaos-consumer); the
# summaries land in chaos-summary.json. It runs the history checker too
# (TestChaosHistory, HISTORY_DURATION per variant, default 10m here); `make
# chaos-history` runs it alone.
chaos:
	CHAOS_DURATION=$${CHAOS_DURATION:-5m} CHAOS_PAYMENTS=$${CHAOS_PAYMENTS:-4000} CHAOS_MESSAGES=$${CHAOS_MESSAGES:-2500} \
		HISTORY_DURATION=$${HISTORY_DURATION:-10m} CHAOS_SUMMARY=$$PWD/chaos-summary.json \
		scripts/test.sh -run TestChaos -v -timeout 90m

# The demo consumer's chaos run alone, on BROKER (nats by default; rabbitmq,
# kafka or sqs; several comma-separated), over CHAOS_MESSAGES (default 2000)
# messages: the one way to run it on Kafka and SQS, which `make test` and
# `make chaos` leave out (their stand-ins, kfake and goaws, are started as
# processes of the test's). The summary lands in chaos-summary.json.
chaos-consumer:
	CHAOS_BROKER=$(BROKER) CHAOS_MESSAGES=$${CHAOS_MESSAGES:-2000} CHAOS_SUMMARY=$$PWD/chaos-summary.json \
		TEST_PACKAGES=./chaos/... scripts/test.sh -run '^TestChaosConsumer$$' -v -timeout 60m

# The history checker alone, at length (chaos/history_test.go): every
# execution mode and entry point on the same keys under Redis faults, in one
# process then in worker processes killed and paused; HISTORY_DURATION
# (default 10m) per variant, HISTORY_SEED to replay a run's choices,
# HISTORY_VARIANT=inprocess|processes for one. A violation fails it,
# listed by kind and by the known bug it matches; the summary lands in
# chaos-summary.json.
chaos-history:
	HISTORY_DURATION=$${HISTORY_DURATION:-10m} CHAOS_SUMMARY=$$PWD/chaos-summary.json \
		scripts/test.sh -run '^TestChaosHistory$$' -v -timeout 60m
