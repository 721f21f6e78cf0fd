package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

func TestBadConfiguration(t *testing.T) {
	db := "postgres://x"
	nats := "nats://127.0.0.1:1"
	oncetest.RequireRejections(t, run, []oncetest.Rejection{
		{Env: map[string]string{"DATABASE_URL": db}, Want: "BROKER_URL (or -broker-url) is required"},
		{Env: map[string]string{"BROKER_URL": nats}, Want: "DATABASE_URL (or -database-url) is required"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": "mqtt://b:1883"}, Want: "say amqp://user:pass@host:port/vhost (RabbitMQ), nats://host:port"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": "kafka://"}, Want: "say kafka://host:port"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": "sqs://h:4566/queue"}, Want: "say sqs://host:port?region=R"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": "nats://"}, Want: "has no host"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": "amqp://u:p@h:notaport/"}, Want: "BROKER_URL"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "CONSUMER_MAX_FAILURES": "0"}, Want: "CONSUMER_MAX_FAILURES"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "CONSUMER_WORKERS": "-1"}, Want: "CONSUMER_WORKERS"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "LEASE_TIMEOUT": "ten"}, Want: `LEASE_TIMEOUT="ten": not a duration`},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "RESUME_INTERVAL": "0s"}, Want: "RESUME_INTERVAL must be positive"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "GATEWAY_URL": "ftp://g"}, Want: "GATEWAY_URL"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "GATEWAY_TIMEOUT": "0s"}, Want: "GATEWAY_TIMEOUT must be positive"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats, "REDIS_URL": "http://x"}, Want: "REDIS_URL"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats}, Args: []string{"-nope"}, Want: "flag provided but not defined"},
		{Env: map[string]string{"DATABASE_URL": db, "BROKER_URL": nats}, Args: []string{"stray"}, Want: `unexpected argument "stray"`},
		{Env: map[string]string{"BROKER_URL": nats}, Args: []string{"publish", "k"}, Want: "say KEY MESSAGE"},
		{Env: map[string]string{}, Args: []string{"publish", "k", "{}"}, Want: "BROKER_URL (or -broker-url) is required"},
		{Env: map[string]string{"BROKER_URL": nats}, Args: []string{"publish", "-copies", "0", "k", "{}"}, Want: "-copies must be at least 1"},
	})
}

// TestBadConfigurationHidesThePassword: a refused BROKER_URL is quoted
// without its password.
func TestBadConfigurationHidesThePassword(t *testing.T) {
	code, stdout, stderr := oncetest.RunMain(t, run, map[string]string{"DATABASE_URL": "postgres://x", "BROKER_URL": "kafka://user:s3cret@b:9092"}) //nolint:gosec // G101: a made-up password the test checks is hidden
	oncetest.RequireOneLineError(t, code, stdout, stderr, "BROKER_URL")
	require.NotContains(t, stderr, "s3cret")
}

func TestHelp(t *testing.T) {
	code, stdout, _ := oncetest.RunMain(t, run, nil, "help")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(stdout, "usage: consumer [flags]"), stdout)
	require.Contains(t, stdout, "consumer publish [flags] KEY MESSAGE")
	code, _, stderr := oncetest.RunMain(t, run, nil, "publish", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-copies")
}

func TestConfigurationIsDocumented(t *testing.T) {
	oncetest.RequireDocumented(t, run)
}
