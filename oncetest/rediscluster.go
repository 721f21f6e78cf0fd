package oncetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
)

// RedisCluster is a Redis Cluster of the test's own: three masters without
// replicas on loopback, without persistence, stopped when the test ends.
// Its nodes keep their cluster configuration across Restart, so a restarted
// master comes back owning the same slots, empty — a cache loss on a third
// of the keyspace.
type RedisCluster struct {
	tb    testing.TB
	Nodes []*RedisServer
}

// NewRedisCluster starts three cluster-enabled redis-server processes and
// joins them into one cluster with redis-cli --cluster create.
func NewRedisCluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		tb.Fatalf("this test needs the redis-cli binary: %v\n%s", err, howToStart)
	}
	c := &RedisCluster{tb: tb}
	for range 3 {
		// The bus port defaults to port+10000, which does not exist for the
		// high ports the kernel hands out: name it.
		c.Nodes = append(c.Nodes, newRedisServer(tb, freePort(tb),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(freePort(tb)),
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	out, err := exec.CommandContext(tb.Context(), "redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy()
	return c
}

// Addrs returns the nodes' host:port addresses.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// URL returns the cluster in go-redis's cluster URL form, as
// REDIS_CLUSTER_URL takes it.
func (c *RedisCluster) URL() string { return ClusterURL(c.Addrs()) }

// ClusterURL returns the go-redis cluster URL of the nodes at addrs.
func ClusterURL(addrs []string) string {
	var u strings.Builder
	u.WriteString("redis://" + addrs[0])
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u.WriteString(sep + "addr=" + a)
	}
	return u.String()
}

// WaitHealthy waits until every node reports the cluster ok and knows the
// other nodes and all 16384 slots.
func (c *RedisCluster) WaitHealthy() {
	c.tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Healthy(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("Redis Cluster not healthy after 20s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Healthy returns nil when every node reports the cluster ok, knows every
// other node and sees all 16384 slots assigned; else what is wrong.
func (c *RedisCluster) Healthy(ctx context.Context) error {
	for _, n := range c.Nodes {
		rdb := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		info, err := rdb.ClusterInfo(ctx).Result()
		_ = rdb.Close()
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", n.Addr(), err)
		case !strings.Contains(info, "cluster_state:ok"),
			!strings.Contains(info, "cluster_slots_assigned:16384"),
			!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))):
			return fmt.Errorf("%s: %s", n.Addr(), strings.ReplaceAll(strings.TrimSpace(info), "\r\n", " "))
		}
	}
	return nil
}

// Client opens a cluster client that is closed when the test ends.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	return ClusterClient(tb, c.URL())
}

// ClusterClient opens a cluster client on url, configured as the commands
// configure theirs, that is closed when the test ends.
func ClusterClient(tb testing.TB, url string) *redis.ClusterClient {
	tb.Helper()
	opts, err := cache.ClientOptions("", url)
	if err != nil {
		tb.Fatalf("Redis Cluster URL: %v", err)
	}
	rdb, ok := redis.NewUniversalClient(opts).(*redis.ClusterClient)
	if !ok {
		tb.Fatalf("%s is not a Redis Cluster URL", redact(url))
	}
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("connect to Redis Cluster (%s): %v\n%s", redact(url), err, howToStart)
	}
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Owner returns the node that serves slot.
func (c *RedisCluster) Owner(ctx context.Context, slot int) (*RedisServer, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr()})
	defer rdb.Close()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster shards: %w", err)
	}
	for _, sh := range shards {
		if !slices.ContainsFunc(sh.Slots, func(r redis.SlotRange) bool {
			return int64(slot) >= r.Start && int64(slot) <= r.End
		}) {
			continue
		}
		for _, m := range sh.Nodes {
			if m.Role != "master" {
				continue
			}
			addr := net.JoinHostPort(m.IP, strconv.FormatInt(m.Port, 10))
			for _, n := range c.Nodes {
				if n.Addr() == addr {
					return n, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no node serves slot %d", slot)
}

// MoveSlot migrates slot, with its keys, to node to, the way redis-cli
// --cluster reshard does: the slot is marked importing on the target and
// migrating on the source, its keys are MIGRATEd in batches while clients
// keep writing (they follow ASK redirections), then every node is told the
// new owner.
func (c *RedisCluster) MoveSlot(ctx context.Context, slot int, to *RedisServer) error {
	from, err := c.Owner(ctx, slot)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	src := redis.NewClient(&redis.Options{Addr: from.Addr()})
	defer src.Close()
	dst := redis.NewClient(&redis.Options{Addr: to.Addr()})
	defer dst.Close()
	srcID, err := src.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("source id: %w", err)
	}
	dstID, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("target id: %w", err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("mark slot %d importing: %w", slot, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("mark slot %d migrating: %w", slot, err)
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 50).Result()
		if err != nil {
			return fmt.Errorf("keys in slot %d: %w", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", to.Port(), "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("migrate %d keys of slot %d: %w", len(keys), slot, err)
		}
	}
	// The target first, so that it owns the slot before the source starts
	// redirecting with MOVED; then everyone else.
	for _, n := range append([]*RedisServer{to, from}, c.Nodes...) {
		rdb := redis.NewClient(&redis.Options{Addr: n.Addr()})
		err := rdb.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		_ = rdb.Close()
		if err != nil {
			return fmt.Errorf("assign slot %d on %s: %w", slot, n.Addr(), err)
		}
	}
	return nil
}

var (
	clusterOnce sync.Once
	clusterURL  string
)

// RedisClusterClient returns a client of the shared test Redis Cluster: the
// one TEST_REDIS_CLUSTER_URL names (scripts/test.sh starts one), else a
// cluster of the test's own.
func RedisClusterClient(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	clusterOnce.Do(func() { clusterURL = os.Getenv("TEST_REDIS_CLUSTER_URL") })
	if clusterURL == "" {
		return NewRedisCluster(tb).Client(tb)
	}
	return ClusterClient(tb, clusterURL)
}
