#!/usr/bin/env bash
# Runs the Citus tests against the Citus cluster whose coordinator
# TEST_CITUS_URL names: the store's statements (test files tagged citus,
# their TestCitus* tests), then the system (the citus/ module: `api migrate
# up` distributes the tables, the tour, a short chaos run, relay and
# reconciler --once). `make test` does not run them (CI has no Citus);
# without TEST_CITUS_URL this fails and says how to build and start a
# cluster (docs/citus.md).
#
# Unless TEST_REDIS_URL is set, it starts a Redis of its own under
# .data/test-citus on port 61813 (TEST_REDIS_PORT) and stops it afterwards.
# It installs nats-server when missing (the tour starts one of its own).
# Extra arguments go to the citus/ module's `go test` (-run TestTour;
# CITUS_CHAOS_PAYMENTS and CITUS_CHAOS_DURATION in the environment size the
# chaos run).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TEST_CITUS_URL:-}" ]; then
	cat >&2 <<-'EOF'
		test-citus: TEST_CITUS_URL is not set: the Citus tests need a Citus 13.2 cluster
		(PostgreSQL 15, a coordinator and two workers). Build Citus once (as root) and start one:
		  CITUS_SRC=/path/to/citus-v13.2.2 scripts/citus.sh build && scripts/citus.sh start .data/citus 61810
		  TEST_CITUS_URL='postgres://postgres@127.0.0.1:61810/postgres?sslmode=disable' make test-citus
		docs/citus.md says where to get the source and what the build needs.
	EOF
	exit 1
fi

started=
cleanup() { if [ -n "$started" ]; then scripts/services.sh stop .data/test-citus; fi; }
trap cleanup EXIT
if [ -z "${TEST_REDIS_URL:-}" ]; then
	p=${TEST_REDIS_PORT:-61813}
	started=1
	scripts/services.sh redis .data/test-citus "$p" test
	export TEST_REDIS_URL="redis://127.0.0.1:$p/0"
fi
scripts/services.sh install-nats

# The store's statements on Citus: the library's test files tagged citus
# (their TestCitus* tests), then the system on Citus (the citus/ module),
# which extra arguments go to.
mapfile -t tagged < <(grep -rlx --include='*_test.go' '//go:build citus' . | xargs -r -n1 dirname | sort -u)
if [ ${#tagged[@]} -gt 0 ]; then
	go test -race -count=1 -timeout 20m -tags citus -run '^TestCitus' "${tagged[@]}"
fi
go test -race -count=1 -timeout 20m "$@" ./citus/...
