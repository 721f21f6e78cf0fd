// Command scan is the reconciler benchmark's baseline: a bare SCAN MATCH of
// the keyspace with COUNT 1000 through go-redis (every master of a cluster,
// one after the other), the least work a pass that visits every Redis key
// can do. It prints keys and keys/s.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
)

func main() {
	url := flag.String("redis-url", "", "Redis URL (redis://127.0.0.1:6379/0 when neither URL is given)")
	clusterURL := flag.String("redis-cluster-url", "", "Redis Cluster URL")
	match := flag.String("match", "idem:*", "SCAN MATCH pattern")
	count := flag.Int64("count", 1000, "SCAN COUNT")
	flag.Parse()
	if *url == "" && *clusterURL == "" {
		*url = "redis://127.0.0.1:6379/0"
	}
	opts, err := cache.ClientOptions(*url, *clusterURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scan:", err)
		os.Exit(2)
	}
	rdb := redis.NewUniversalClient(opts)
	began := time.Now()
	n, err := countKeys(context.Background(), rdb, *match, *count)
	took := time.Since(began)
	_ = rdb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scan:", err)
		os.Exit(1)
	}
	fmt.Printf(`{"keys":%d,"duration_ms":%d,"keys_per_s":%.0f}`+"\n", n, took.Milliseconds(), float64(n)/took.Seconds())
}

// countKeys counts the keys matching match on every master, SCANning
// count at a time.
func countKeys(ctx context.Context, rdb redis.UniversalClient, match string, count int64) (int, error) {
	var n int
	err := cache.ForEachNode(ctx, rdb, func(ctx context.Context, node redis.UniversalClient) error {
		iter := node.Scan(ctx, 0, match, count).Iterator()
		for iter.Next(ctx) {
			n++
		}
		return iter.Err()
	})
	return n, err
}
