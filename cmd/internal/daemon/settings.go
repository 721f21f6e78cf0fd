package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon/logger"
	"github.com/onceonly/onceonly/cmd/internal/daemon/postgres"
)

// Common is the configuration every daemon with Redis shares.
type Common struct {
	DatabaseURL, RedisURL, RedisClusterURL, RedisSentinelURL, RedisPrefix, HTTPAddr, LogLevel, LogFormat *string
	// RedisWriteLayout1: completed values are written in layout 1 (see
	// cache.Options.WriteLayout1).
	RedisWriteLayout1 *bool
}

// DefineCommon defines the shared settings on s; httpAddr is the daemon's
// default listen address and redisURLText the help of its REDIS_URL.
func DefineCommon(s *config.Set, httpAddr, redisURLText string) *Common {
	return &Common{
		DatabaseURL:      s.String("database-url", "DATABASE_URL", "", "Postgres URL (required)"),
		RedisURL:         s.String("redis-url", "REDIS_URL", "", redisURLText),
		RedisClusterURL:  s.String("redis-cluster-url", "REDIS_CLUSTER_URL", "", "Redis Cluster seed nodes, go-redis form: redis://[user:pass@]h1:6379?addr=h2:6379&addr=h3:6379"),
		RedisSentinelURL: s.String("redis-sentinel-url", "REDIS_SENTINEL_URL", "", "Redis behind Sentinel, go-redis failover form: redis://[user:pass@]s1:26379?master_name=NAME&addr=s2:26379&addr=s3:26379 (user:pass for the Sentinels, password= for the master); instead of REDIS_URL"),
		RedisPrefix:      s.String("redis-prefix", "REDIS_PREFIX", cache.DefaultPrefix, "prefix of every Redis key"),
		RedisWriteLayout1: s.Bool("redis-write-layout1", "REDIS_WRITE_LAYOUT1", false,
			"write completed values in the layout releases before 2026-11-24 read: set it on every api, relay and reconciler during a rolling upgrade from one, unset it once none runs"),
		HTTPAddr:  s.String("http-addr", "HTTP_ADDR", httpAddr, "listen address of /healthz, /readyz and /metrics (and of the API, for the api)"),
		LogLevel:  s.String("log-level", "LOG_LEVEL", "info", "debug, info, warn or error"),
		LogFormat: s.String("log-format", "LOG_FORMAT", "json", "json or text"),
	}
}

// Setup is the shared configuration, validated.
type Setup struct {
	Log      *slog.Logger
	Postgres *pgxpool.Config
	// Redis is nil when none of REDIS_URL, REDIS_CLUSTER_URL and
	// REDIS_SENTINEL_URL is set (and Redis is not required).
	Redis *redis.UniversalOptions
	// Sentinel is true when Redis is reached through Sentinel.
	Sentinel bool
}

// Validate checks the shared settings of set (parsed) without connecting
// anywhere; logs go to stderr. With redisRequired, one of the three Redis
// URLs must be set. The error is one line, for the command to print.
func (c *Common) Validate(stderr io.Writer, set *config.Set, redisRequired bool) (Setup, error) {
	if err := set.Require(map[string]*string{"database-url": c.DatabaseURL}); err != nil {
		return Setup{}, err
	}
	var s Setup
	var err error
	if s.Log, err = logger.New(stderr, *c.LogLevel, *c.LogFormat); err != nil {
		return Setup{}, err
	}
	if s.Postgres, err = postgres.Parse(*c.DatabaseURL); err != nil {
		return Setup{}, err
	}
	switch {
	case *c.RedisSentinelURL != "" && (*c.RedisURL != "" || *c.RedisClusterURL != ""):
		return Setup{}, errors.New("bad configuration: set one of REDIS_URL, REDIS_CLUSTER_URL and REDIS_SENTINEL_URL, not several")
	case *c.RedisSentinelURL != "":
		if s.Redis, err = cache.SentinelClientOptions(*c.RedisSentinelURL); err != nil {
			return Setup{}, err
		}
		s.Sentinel = true
	case redisRequired || *c.RedisURL != "" || *c.RedisClusterURL != "":
		if s.Redis, err = cache.ClientOptions(*c.RedisURL, *c.RedisClusterURL); err != nil {
			return Setup{}, err
		}
	}
	return s, nil
}

// ParseArgs parses args on set and reports how to go on: ok false means
// return code (0 after -h, which printed the usage; 2 after a bad flag or a
// stray argument, reported on stderr as one line prefixed by command).
func ParseArgs(set *config.Set, command string, args []string, stderr io.Writer) (code int, ok bool) {
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return 2, false
	}
	if len(set.Args()) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", command, set.Args()[0])
		return 2, false
	}
	return 0, true
}
