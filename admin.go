package onceonly

import (
	"context"
	"fmt"
	"time"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
)

// Inspection is a key's Postgres row and Redis value side by side.
type Inspection struct {
	// Postgres is the key's row; nil when there is none.
	Postgres *StoredKey
	// Redis is the decoded Redis value; nil when absent, when it does not
	// decode, or when the engine runs without Redis (RedisEnabled false).
	Redis *CachedKey
	// RedisEnabled is false for an engine without Redis.
	RedisEnabled bool
	// RedisTTL is the value's time to live.
	RedisTTL time.Duration
	// RedisErr says why Redis could not be read, or (with RedisFound set)
	// that the value is not in the layout.
	RedisErr error
	// RedisFound is true when Redis holds a value for the key.
	RedisFound bool
}

// KeyStatus is the state of a key: "in_progress", "completed" or
// "failed", the words Postgres and Redis both hold.
type KeyStatus string

// The key states.
const (
	StatusInProgress KeyStatus = "in_progress"
	StatusCompleted  KeyStatus = "completed"
	StatusFailed     KeyStatus = "failed"
)

// StoredKey is a key's row in Postgres.
type StoredKey struct {
	Status KeyStatus
	// Version is bumped by every transition of the key.
	Version int64
	// Fingerprint identifies the request that claimed the key.
	Fingerprint string
	// Owner (the lease holder's token) and LeaseRemaining are set while the
	// key is in progress.
	Owner          string
	LeaseRemaining time.Duration
	// Response is set once the key is completed.
	Response Result
	// ExpiresIn is the time left until the row may be deleted; zero or
	// less means the key is gone (expired or purged).
	ExpiresIn time.Duration
	// Failures counts the executions of the key that ended failed in its
	// lifecycle (see ExecutionError.Failures).
	Failures int
}

// CachedKey is a key's value in Redis, decoded.
type CachedKey struct {
	Status  KeyStatus
	Version int64
	// Provisional is true for a claim Redis made that Postgres has not
	// confirmed yet.
	Provisional bool
	// Owner is the lease holder's token (in progress only).
	Owner string
	// LeaseRemaining is the time left on the lease the value holds, by
	// Redis's clock (negative once over); LeaseRead says it was read (in
	// progress only, and only if Redis's clock could be read).
	LeaseRemaining time.Duration
	LeaseRead      bool
	// Response is the stored response (completed only); its Body is nil
	// when BodyInPostgres is true (too large for the cache).
	Response       Result
	BodyInPostgres bool
}

// InSync reports whether Redis agrees with Postgres: a live key has the
// same state and version in both, a key without a live row has no value.
func (in Inspection) InSync() bool {
	live := in.Postgres != nil && in.Postgres.ExpiresIn > 0
	if !live {
		return !in.RedisFound
	}
	return in.Redis != nil && in.Redis.Status == in.Postgres.Status && in.Redis.Version == in.Postgres.Version
}

// Inspect reads (scope, key) in Postgres and in Redis.
func (e *Engine) Inspect(ctx context.Context, scope, key string) (Inspection, error) {
	if err := e.made(); err != nil {
		return Inspection{}, err
	}
	ref := keystate.Ref{Scope: scope, Key: key}
	var in Inspection
	k, found, err := e.store.Get(ctx, e.cfg.Pool, ref)
	if err != nil {
		return in, fmt.Errorf("inspect key: %w", err)
	}
	if found {
		in.Postgres = &StoredKey{
			Status: KeyStatus(k.Status), Version: k.Version, Fingerprint: k.Fingerprint,
			LeaseRemaining: k.LeaseRemaining, Response: Result(k.Response), ExpiresIn: k.ExpiresIn, Failures: k.Failures,
		}
		if k.Status == keystate.InProgress {
			in.Postgres.Owner = k.Owner.String()
		}
	}
	if e.cache == nil {
		return in, nil
	}
	in.RedisEnabled = true
	entry, inRedis, err := e.cache.Read(ctx, ref)
	in.RedisFound, in.RedisErr = inRedis, err
	if err == nil && inRedis {
		in.Redis = &CachedKey{
			Status: KeyStatus(entry.State), Version: entry.Version, Provisional: entry.Provisional,
			Response: Result(entry.Response), BodyInPostgres: entry.BodyInPostgres,
		}
		if entry.State == keystate.InProgress {
			in.Redis.Owner = entry.Owner.String()
			if nowMs, err := cache.RedisTimeMs(ctx, e.cache.Client()); err == nil && entry.LeaseUntilMs > 0 {
				in.Redis.LeaseRemaining = time.Duration(entry.LeaseUntilMs-nowMs) * time.Millisecond
				in.Redis.LeaseRead = true
			}
		}
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
// worker cannot complete it. It returns ErrNoSuchKey or ErrKeyInProgress.
// A Redis copy that cannot be deleted now is logged: the relay deletes it.
func (e *Engine) Purge(ctx context.Context, scope, key string, force bool) error {
	if err := e.made(); err != nil {
		return err
	}
	k, found, err := e.store.Purge(ctx, e.cfg.Pool, keystate.Ref{Scope: scope, Key: key}, force)
	switch {
	case err != nil:
		return fmt.Errorf("purge key: %w", fromStore(err))
	case !found:
		return ErrNoSuchKey
	}
	if e.cache != nil {
		if _, err := e.cache.Apply(ctx, k); err != nil {
			e.log.Warn("purge: Redis not updated now; the relay will", "scope", scope, "key", key, "err", err)
		}
	}
	return nil
}
