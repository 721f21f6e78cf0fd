// Package deploytest holds the tests of onceonly as it is deployed, kept out
// of the root package so that `go test .` stays quick: the Compose file and
// the Dockerfile (deploy_test.go), a Redis Cluster changing its topology
// under traffic (cluster_test.go), a Redis Sentinel failover under load
// (sentinel_test.go) and a whole deployment through PgBouncer in transaction
// mode (pgbouncer_test.go).
//
// The tests use only what a user has — the root package's API, the relay,
// the reconciler and the commands' binaries — plus oncetest for
// servers and cache to compare Redis with Postgres. Each test
// starts the servers it disrupts (a cluster, a Sentinel group) and takes
// Postgres, Redis and PgBouncer from the environment as every other
// package's tests do (see oncetest). The package has no code
// besides this comment.
package deploytest
