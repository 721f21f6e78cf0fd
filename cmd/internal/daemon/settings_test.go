package daemon_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/oncetest"
)

// define clears the commands' environment, sets env, and defines the
// shared settings on a fresh set. Tests using it must not be parallel.
func define(t *testing.T, env map[string]string) (*config.Set, *daemon.Common, *bytes.Buffer) {
	t.Helper()
	for _, k := range oncetest.ConfigEnv {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out bytes.Buffer
	set := config.NewSet("daemon", &out)
	set.SetSynopsis("usage: daemon [flags]")
	return set, daemon.DefineCommon(set, ":9999", "Redis URL"), &out
}

// validate defines, parses and validates.
func validate(t *testing.T, env map[string]string, redisRequired bool) (daemon.Setup, error) {
	t.Helper()
	set, c, _ := define(t, env)
	require.NoError(t, set.Parse(nil))
	return c.Validate(&bytes.Buffer{}, set, redisRequired)
}

func TestDefaults(t *testing.T) {
	set, c, _ := define(t, nil)
	require.NoError(t, set.Parse(nil))
	require.Equal(t, ":9999", *c.HTTPAddr)
	require.Equal(t, "idem:", *c.RedisPrefix)
	require.Equal(t, "info", *c.LogLevel)
	require.Equal(t, "json", *c.LogFormat)
	require.False(t, *c.RedisWriteLayout1)
	require.Empty(t, *c.DatabaseURL)
}

// TestEnvAndFlags: every setting is read from its variable, and its flag
// wins.
func TestEnvAndFlags(t *testing.T) {
	set, c, _ := define(t, map[string]string{
		"DATABASE_URL": "postgres://env/db", "REDIS_URL": "redis://env:6379", "REDIS_PREFIX": "env:",
		"HTTP_ADDR": ":1", "LOG_LEVEL": "debug", "LOG_FORMAT": "text", "REDIS_WRITE_LAYOUT1": "true",
		"REDIS_CLUSTER_URL": "redis://c:1", "REDIS_SENTINEL_URL": "redis://s:1?master_name=m",
	})
	require.NoError(t, set.Parse([]string{"-database-url", "postgres://flag/db", "-http-addr", ":2"}))
	require.Equal(t, "postgres://flag/db", *c.DatabaseURL)
	require.Equal(t, ":2", *c.HTTPAddr)
	require.Equal(t, "redis://env:6379", *c.RedisURL)
	require.Equal(t, "redis://c:1", *c.RedisClusterURL)
	require.Equal(t, "redis://s:1?master_name=m", *c.RedisSentinelURL)
	require.Equal(t, "env:", *c.RedisPrefix)
	require.Equal(t, "debug", *c.LogLevel)
	require.Equal(t, "text", *c.LogFormat)
	require.True(t, *c.RedisWriteLayout1)
}

func TestValidate(t *testing.T) {
	db := map[string]string{"DATABASE_URL": "postgres://u@db.example/app"}
	s, err := validate(t, db, false)
	require.NoError(t, err)
	require.NotNil(t, s.Log)
	require.Equal(t, "db.example", s.Postgres.ConnConfig.Host)
	require.Nil(t, s.Redis, "no Redis, none required: Postgres only")
	require.False(t, s.Sentinel)

	s, err = validate(t, oncetest.EnvWith(db, "REDIS_URL", "redis://cache:6380/2"), true)
	require.NoError(t, err)
	require.Equal(t, []string{"cache:6380"}, s.Redis.Addrs)
	require.False(t, s.Redis.IsClusterMode)

	s, err = validate(t, oncetest.EnvWith(db, "REDIS_CLUSTER_URL", "redis://h1:7000?addr=h2:7001"), true)
	require.NoError(t, err)
	require.True(t, s.Redis.IsClusterMode)

	s, err = validate(t, oncetest.EnvWith(db, "REDIS_SENTINEL_URL", "redis://s1:26379?master_name=m"), true)
	require.NoError(t, err)
	require.True(t, s.Sentinel)
	require.Equal(t, "m", s.Redis.MasterName)
}

// TestValidateRejects: every bad setting is one line naming its variable.
func TestValidateRejects(t *testing.T) {
	db := map[string]string{"DATABASE_URL": "postgres://u@db.example/app"}
	for _, tc := range []struct {
		env           map[string]string
		redisRequired bool
		want          string
	}{
		{nil, false, "DATABASE_URL (or -database-url) is required"},
		{map[string]string{"DATABASE_URL": "  "}, false, "DATABASE_URL (or -database-url) is required"},
		{map[string]string{"DATABASE_URL": "postgres://u@h:port/db"}, false, "bad configuration: DATABASE_URL: "},
		{oncetest.EnvWith(db, "LOG_LEVEL", "loud"), false, `LOG_LEVEL="loud"`},
		{oncetest.EnvWith(db, "LOG_FORMAT", "xml"), false, `LOG_FORMAT="xml"`},
		{db, true, "REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required"},
		{oncetest.EnvWith(db, "REDIS_URL", "http://cache"), false, "REDIS_URL: "},
		{oncetest.EnvWith(db, "REDIS_CLUSTER_URL", "http://cache"), false, "REDIS_CLUSTER_URL: "},
		{oncetest.EnvWith(oncetest.EnvWith(db, "REDIS_URL", "redis://a"), "REDIS_CLUSTER_URL", "redis://b"), false, "not both"},
		{oncetest.EnvWith(oncetest.EnvWith(db, "REDIS_URL", "redis://a"), "REDIS_SENTINEL_URL", "redis://s?master_name=m"), false, "not several"},
		{oncetest.EnvWith(db, "REDIS_SENTINEL_URL", "redis://s1:26379"), true, "master_name is required"},
	} {
		_, err := validate(t, tc.env, tc.redisRequired)
		require.ErrorContains(t, err, tc.want, "%v", tc.env)
		require.NotContains(t, err.Error(), "\n")
		require.True(t, strings.HasPrefix(err.Error(), "bad configuration: "), err)
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		ok     bool
		stderr string
	}{
		{nil, 0, true, ""},
		{[]string{"-http-addr", ":1"}, 0, true, ""},
		{[]string{"-h"}, 0, false, ""},
		{[]string{"-nope"}, 2, false, "daemon: bad flag: flag provided but not defined: -nope\n"},
		{[]string{"extra"}, 2, false, "daemon: unexpected argument \"extra\"\n"},
		{[]string{"-log-level", "warn", "extra", "more"}, 2, false, "daemon: unexpected argument \"extra\"\n"},
	} {
		set, _, out := define(t, nil)
		var stderr bytes.Buffer
		code, ok := daemon.ParseArgs(set, "daemon", tc.args, &stderr)
		require.Equal(t, tc.code, code, tc.args)
		require.Equal(t, tc.ok, ok, tc.args)
		require.Equal(t, tc.stderr, stderr.String(), tc.args)
		if len(tc.args) == 1 && tc.args[0] == "-h" {
			require.Contains(t, out.String(), "usage: daemon [flags]")
			for _, env := range []string{"DATABASE_URL", "REDIS_URL", "REDIS_CLUSTER_URL", "REDIS_SENTINEL_URL", "REDIS_PREFIX", "REDIS_WRITE_LAYOUT1", "HTTP_ADDR", "LOG_LEVEL", "LOG_FORMAT"} {
				require.Contains(t, out.String(), "(env "+env+")")
			}
		}
	}
}

// TestBadEnvValue: a variable that does not parse is reported by Parse,
// naming it.
func TestBadEnvValue(t *testing.T) {
	set, _, _ := define(t, map[string]string{"REDIS_WRITE_LAYOUT1": "maybe"})
	var stderr bytes.Buffer
	code, ok := daemon.ParseArgs(set, "daemon", nil, &stderr)
	require.False(t, ok)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), `REDIS_WRITE_LAYOUT1="maybe": use true or false`)
}
