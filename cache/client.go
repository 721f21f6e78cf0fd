// Client constructors: the Redis client every onceonly command makes, from
// a REDIS_URL (one server), a REDIS_CLUSTER_URL (a cluster) or a
// REDIS_SENTINEL_URL (a primary behind Sentinel), configured to fail fast.
//
// A cache must fail fast: when a server (or one master) is unreachable, the
// engine answers from Postgres and the relay defers that node's keys, so a
// failed dial is retried once after 10ms rather than go-redis's default of
// five times 100ms, and every call is bounded by one-second timeouts.

package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fail-fast bounds of every client (see the top of this file).
const (
	callTimeout  = time.Second
	dialRetries  = 1
	dialRetryGap = 10 * time.Millisecond
)

// ErrNoRedisURL is ClientOptions' error when it is given neither URL.
var ErrNoRedisURL = errors.New("bad configuration: REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required")

// ClientOptions validates REDIS_URL (url) or REDIS_CLUSTER_URL
// (clusterURL), exactly one of them, and returns fail-fast universal client
// options: NewClient makes a cluster client of the second, whose pipelines
// Cache splits per node.
func ClientOptions(url, clusterURL string) (*redis.UniversalOptions, error) {
	var o *redis.UniversalOptions
	switch {
	case url != "" && clusterURL != "":
		return nil, errors.New("bad configuration: set REDIS_URL or REDIS_CLUSTER_URL, not both")
	case clusterURL != "":
		c, err := redis.ParseClusterURL(clusterURL)
		if err != nil {
			return nil, fmt.Errorf("bad configuration: REDIS_CLUSTER_URL: %w", err)
		}
		o = &redis.UniversalOptions{Addrs: c.Addrs, Username: c.Username, Password: c.Password,
			TLSConfig: c.TLSConfig, IsClusterMode: true, PoolSize: c.PoolSize}
	case url != "":
		c, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("bad configuration: REDIS_URL: %w", err)
		}
		o = &redis.UniversalOptions{Addrs: []string{c.Addr}, Username: c.Username, Password: c.Password,
			DB: c.DB, TLSConfig: c.TLSConfig, PoolSize: c.PoolSize}
	default:
		return nil, ErrNoRedisURL
	}
	failFast(o)
	return o, nil
}

// SentinelClientOptions validates a REDIS_SENTINEL_URL (go-redis failover form:
// redis://[user:pass@]sentinel:port?master_name=NAME&addr=sentinel2:port…,
// where user:pass are the Sentinels' credentials and password= the
// master's) and returns universal client options for a failover client:
// every connection asks the Sentinels for the current master, so the
// command follows a failover.
func SentinelClientOptions(url string) (*redis.UniversalOptions, error) {
	c, err := redis.ParseFailoverURL(url)
	if err != nil {
		return nil, fmt.Errorf("bad configuration: REDIS_SENTINEL_URL: %w", err)
	}
	if c.MasterName == "" {
		return nil, errors.New("bad configuration: REDIS_SENTINEL_URL: master_name is required (redis://sentinel:26379?master_name=NAME&addr=…)")
	}
	o := &redis.UniversalOptions{Addrs: c.SentinelAddrs, MasterName: c.MasterName,
		SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword,
		Username: c.Username, Password: c.Password, DB: c.DB, TLSConfig: c.TLSConfig, PoolSize: c.PoolSize}
	failFast(o)
	return o, nil
}

// failFast bounds every call and dial of a client made from o.
func failFast(o *redis.UniversalOptions) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = callTimeout, callTimeout, callTimeout
	o.DialerRetries, o.DialerRetryTimeout = dialRetries, dialRetryGap
}

// NewClient makes the client of opts: a cluster client for ClientOptions
// of a REDIS_CLUSTER_URL, a single-server one for a REDIS_URL, a failover
// client for SentinelClientOptions; nil when opts is nil (no Redis
// configured).
func NewClient(opts *redis.UniversalOptions) redis.UniversalClient {
	if opts == nil {
		return nil
	}
	return redis.NewUniversalClient(opts)
}

// ReadyCheck returns a readiness check that pings every server behind rdb
// (every master of a cluster).
func ReadyCheck(rdb redis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error {
		return ForEachNode(ctx, rdb, func(ctx context.Context, node redis.UniversalClient) error {
			return node.Ping(ctx).Err() // /readyz shows it under "redis"
		})
	}
}
