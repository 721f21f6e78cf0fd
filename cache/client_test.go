package cache_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/oncetest"
)

// requireFailFast checks the bounds every client gets.
func requireFailFast(t *testing.T, o *redis.UniversalOptions) {
	t.Helper()
	require.Equal(t, time.Second, o.DialTimeout)
	require.Equal(t, time.Second, o.ReadTimeout)
	require.Equal(t, time.Second, o.WriteTimeout)
	require.Equal(t, 1, o.DialerRetries)
	require.Equal(t, 10*time.Millisecond, o.DialerRetryTimeout)
}

func TestOptionsSingle(t *testing.T) {
	o, err := cache.ClientOptions("redis://user:secret@cache.example:6380/3?pool_size=12", "")
	require.NoError(t, err)
	require.Equal(t, []string{"cache.example:6380"}, o.Addrs)
	require.Equal(t, "user", o.Username)
	require.Equal(t, "secret", o.Password)
	require.Equal(t, 3, o.DB)
	require.Equal(t, 12, o.PoolSize)
	require.False(t, o.IsClusterMode)
	require.Nil(t, o.TLSConfig)
	requireFailFast(t, o)

	o, err = cache.ClientOptions("rediss://cache.example:6380", "")
	require.NoError(t, err)
	require.NotNil(t, o.TLSConfig, "rediss:// is TLS")
}

func TestOptionsCluster(t *testing.T) {
	o, err := cache.ClientOptions("", "redis://:pw@h1:7000?addr=h2:7001&addr=h3:7002")
	require.NoError(t, err)
	require.Equal(t, []string{"h1:7000", "h2:7001", "h3:7002"}, o.Addrs)
	require.Equal(t, "pw", o.Password)
	require.True(t, o.IsClusterMode)
	requireFailFast(t, o)
	rdb := cache.NewClient(o)
	defer rdb.Close()
	_, ok := rdb.(*redis.ClusterClient)
	require.True(t, ok, "a cluster URL makes a cluster client")
}

func TestSentinelOptions(t *testing.T) {
	o, err := cache.SentinelClientOptions("redis://suser:spass@s1:26379/2?master_name=mymaster&addr=s2:26379&password=mpass")
	require.NoError(t, err)
	require.Equal(t, "mymaster", o.MasterName)
	require.ElementsMatch(t, []string{"s1:26379", "s2:26379"}, o.Addrs)
	require.Equal(t, "suser", o.SentinelUsername, "user:pass@ are the Sentinels'")
	require.Equal(t, "spass", o.SentinelPassword)
	require.Equal(t, "mpass", o.Password, "password= is the master's")
	require.Equal(t, 2, o.DB)
	requireFailFast(t, o)
	rdb := cache.NewClient(o)
	defer rdb.Close()
	_, ok := rdb.(*redis.Client)
	require.True(t, ok, "a Sentinel URL makes a failover client")
}

func TestBadURLs(t *testing.T) {
	for _, tc := range []struct {
		url, cluster, sentinel, want string
	}{
		{want: "REDIS_URL (or REDIS_CLUSTER_URL or REDIS_SENTINEL_URL) is required"},
		{url: "redis://a", cluster: "redis://b", want: "set REDIS_URL or REDIS_CLUSTER_URL, not both"},
		{url: "http://cache", want: "bad configuration: REDIS_URL: "},
		{cluster: "http://cache", want: "bad configuration: REDIS_CLUSTER_URL: "},
		{sentinel: "http://s1:26379?master_name=m", want: "bad configuration: REDIS_SENTINEL_URL: "},
		{sentinel: "redis://s1:26379", want: "master_name is required"},
	} {
		var err error
		if tc.sentinel != "" {
			_, err = cache.SentinelClientOptions(tc.sentinel)
		} else {
			_, err = cache.ClientOptions(tc.url, tc.cluster)
		}
		require.ErrorContains(t, err, tc.want)
	}
	_, err := cache.ClientOptions("", "")
	require.ErrorIs(t, err, cache.ErrNoRedisURL)
}

func TestNewWithoutRedis(t *testing.T) {
	require.Nil(t, cache.NewClient(nil))
}

// TestCheck: the readiness check pings the server, and fails fast once it
// is gone.
func TestReadyCheck(t *testing.T) {
	srv := oncetest.NewRedisServer(t)
	o, err := cache.ClientOptions(srv.URL(), "")
	require.NoError(t, err)
	rdb := cache.NewClient(o)
	defer rdb.Close()
	check := cache.ReadyCheck(rdb)
	require.NoError(t, check(t.Context()))
	srv.Stop()
	began := time.Now()
	require.Error(t, check(t.Context()))
	require.Less(t, time.Since(began), 5*time.Second, "the check fails fast")
}
