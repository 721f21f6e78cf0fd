package onceonly

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onceonly/onceonly/internal/cache"
	"github.com/onceonly/onceonly/internal/keystate"
	"github.com/onceonly/onceonly/internal/keystore"
)

// ErrKeyInProgress is returned by Purge for a key whose lease is held,
// unless forced: purging it would let a duplicate run beside it.
var ErrKeyInProgress = keystore.ErrKeyInProgress

// ErrNoSuchKey is returned by Purge for a key that has no row.
var ErrNoSuchKey = errors.New("no such key")

// Inspection is a key's Postgres row and Redis entry side by side.
type Inspection struct {
	// Postgres is the key's row; nil when there is none.
	Postgres *keystate.Key
	// Redis is the decoded Redis entry; nil when absent or when the engine
	// runs without Redis (RedisEnabled false).
	Redis *cache.Entry
	// RedisEnabled is false for an engine without Redis.
	RedisEnabled bool
	// RedisTTL is the entry's time to live.
	RedisTTL time.Duration
	// RedisErr says why Redis could not be read, or that the value is not
	// in the layout (cache.ErrCorrupt, with RedisFound set).
	RedisErr error
	// RedisFound is true when Redis holds a value for the key.
	RedisFound bool
}

// InSync reports whether Redis agrees with Postgres: a live key has the
// same state and version in both, a key without a live row has no entry.
func (in Inspection) InSync() bool {
	live := in.Postgres != nil && in.Postgres.ExpiresIn > 0
	if !live {
		return !in.RedisFound
	}
	return in.Redis != nil && in.Redis.State == in.Postgres.Status && in.Redis.Version == in.Postgres.Version
}

// Inspect reads (scope, key) in Postgres and in Redis.
func (e *Engine) Inspect(ctx context.Context, scope, key string) (Inspection, error) {
	ref := keystate.Ref{Scope: scope, Key: key}
	var in Inspection
	k, found, err := e.store.Get(ctx, e.cfg.Pool, ref)
	if err != nil {
		return in, fmt.Errorf("inspect key: %w", err)
	}
	if found {
		in.Postgres = &k
	}
	if e.cache == nil {
		return in, nil
	}
	in.RedisEnabled = true
	entry, inRedis, err := e.cache.Read(ctx, ref)
	in.RedisFound, in.RedisErr = inRedis, err
	if err == nil && inRedis {
		in.Redis = &entry
		if ttl, err := e.cache.Client().PTTL(ctx, e.cache.Key(ref)).Result(); err == nil && ttl > 0 {
			in.RedisTTL = ttl
		}
	}
	return in, nil
}

// Purge forgets (scope, key) safely: the row expires now, one version up,
// through the outbox (so no relay or reconciler brings the old state back),
// the Redis copy is deleted at once, and the next request with the key is a
// first execution. A key in progress needs force; it becomes failed, so its
// worker cannot complete it. It returns ErrNoSuchKey or ErrKeyInProgress,
// and a cacheErr when the Redis copy could not be deleted now (the relay
// deletes it).
func (e *Engine) Purge(ctx context.Context, scope, key string, force bool) (cacheErr, err error) {
	k, found, err := e.store.Purge(ctx, e.cfg.Pool, keystate.Ref{Scope: scope, Key: key}, force)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, ErrNoSuchKey
	case e.cache == nil:
		return nil, nil
	}
	if _, err := e.cache.Apply(ctx, k); err != nil {
		return err, nil
	}
	return nil, nil
}
