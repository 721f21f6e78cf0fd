package cache

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ForEachNode calls fn once per Redis server that holds keys, one after the
// other: every master of a cluster, or the one server behind any other
// client. SCAN and FLUSHALL see a single server's keyspace, so whatever walks
// or wipes the whole keyspace goes through here.
func ForEachNode(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, node redis.UniversalClient) error) error {
	cluster, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return fn(ctx, rdb)
	}
	var mu sync.Mutex
	var masters []*redis.Client
	err := cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, c)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list Redis masters: %w", err)
	}
	for _, m := range masters {
		if err := fn(ctx, m); err != nil {
			return err
		}
	}
	return nil
}
