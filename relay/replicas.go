package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
)

// DefaultWaitTimeout is how long a batch waits for Redis replicas by
// default (Config.WaitTimeout).
const DefaultWaitTimeout = time.Second

// ErrReplicasBehind says a batch reached fewer Redis replicas than
// Config.WaitReplicas within Config.WaitTimeout: its events stay in the
// outbox and the batch is tried again.
var ErrReplicasBehind = errors.New("redis replicas behind")

// replicaWait makes a batch's Redis writes durable across a failover before
// its events are deleted: Redis replicates asynchronously, so a write the
// primary acknowledged may be missing on the replica Sentinel promotes, and
// an event deleted on that acknowledgement would be lost for good (the key
// would read as an older version, "in flight" for the rest of its lease,
// until the reconciler's next pass).
//
// WAIT counts the replicas that acknowledged the replication offset its own
// connection last wrote at. The apply pipeline runs on other connections,
// and an apply that changed nothing (the engine's write-through got there
// first) writes nothing at all, so the wait first makes a write of its own
// on its connection — a PUBLISH, which a primary that is not a cluster node
// propagates to its replicas — whose offset is past every write of the
// batch and of everyone before it, then waits for that. (Redis 7.0 already
// moves a connection's offset on any command; a bare WAIT on a fresh
// connection still counts a replica that lags.)
//
// What it does not cover: a whole failover between the apply and the wait
// (longer than Sentinel's down-after-milliseconds), after which the wait
// counts the new primary's replicas; the reconciler repairs what that loses.
type replicaWait struct {
	rdb      *redis.Client
	replicas int
	timeout  time.Duration
	channel  string
}

// newReplicaWait returns the guard for cfg, nil when cfg.WaitReplicas is 0.
func newReplicaWait(cfg Config, c *cache.Cache) (*replicaWait, error) {
	if cfg.WaitReplicas == 0 {
		return nil, nil //nolint:nilnil // no guard, no error
	}
	if cfg.WaitReplicas < 0 {
		return nil, errors.New("relay: WaitReplicas must not be negative")
	}
	rdb, ok := c.Client().(*redis.Client)
	if !ok {
		return nil, errors.New("relay: WaitReplicas needs one Redis primary (REDIS_URL or REDIS_SENTINEL_URL), not a cluster")
	}
	return &replicaWait{rdb: rdb, replicas: cfg.WaitReplicas, timeout: cfg.WaitTimeout,
		channel: c.Prefix() + "relay:replicated"}, nil
}

// wait returns nil once w.replicas replicas hold everything the primary
// had acknowledged before it was called, else an error wrapping
// ErrReplicasBehind (after w.timeout) or the Redis failure.
func (w *replicaWait) wait(ctx context.Context) error {
	conn := w.rdb.Conn()
	defer conn.Close()
	if err := conn.Publish(ctx, w.channel, "").Err(); err != nil {
		return fmt.Errorf("wait for Redis replicas: publish: %w", err)
	}
	n, err := conn.Wait(ctx, w.replicas, w.timeout).Result()
	if err != nil {
		return fmt.Errorf("wait for Redis replicas: %w", err)
	}
	if int(n) < w.replicas {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %s; the events stay in the outbox",
			ErrReplicasBehind, n, w.replicas, w.timeout)
	}
	return nil
}
