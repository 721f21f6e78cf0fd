package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/internal/daemon"
	"github.com/onceonly/onceonly/outbox"
)

// keyView is what `api keys show` prints: the Postgres row and the Redis
// entry of one key, side by side.
type keyView struct {
	Scope    string       `json:"scope"`
	Key      string       `json:"key"`
	Postgres *postgresRow `json:"postgres"`
	Redis    *redisEntry  `json:"redis"`
	InSync   *bool        `json:"in_sync,omitempty"`
}

type postgresRow struct {
	Status           string  `json:"status"`
	Version          int64   `json:"version"`
	Fingerprint      string  `json:"fingerprint"`
	LeaseRemainingMs *int64  `json:"lease_remaining_ms,omitempty"`
	ResponseStatus   *int    `json:"response_status,omitempty"`
	ResponseBytes    *int    `json:"response_bytes,omitempty"`
	ExpiresInMs      int64   `json:"expires_in_ms"`
	Owner            *string `json:"owner,omitempty"`
}

type redisEntry struct {
	Found          bool   `json:"found"`
	State          string `json:"state,omitempty"`
	Version        int64  `json:"version,omitempty"`
	Provisional    bool   `json:"provisional,omitempty"`
	BodyInPostgres bool   `json:"body_in_postgres,omitempty"`
	ResponseStatus int    `json:"response_status,omitempty"`
	TTLMs          int64  `json:"ttl_ms,omitempty"`
	Error          string `json:"error,omitempty"`
}

// keysCommand runs `api keys show|purge [--force] SCOPE KEY`.
func keysCommand(ctx context.Context, pgCfg *pgxpool.Config, rdbOpts *redis.UniversalOptions, prefix, cmd string,
	force bool, scope, key string, stdout io.Writer,
) error {
	pool, err := pgxpool.NewWithConfig(ctx, pgCfg)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	var c *cache.Cache
	if rdb := daemon.NewRedis(rdbOpts); rdb != nil {
		defer rdb.Close()
		c = cache.New(rdb, cache.Options{Prefix: prefix})
	}
	store := outbox.New(outbox.Config{})
	switch cmd {
	case "show":
	case "purge":
		k, found, err := store.Purge(ctx, pool, scope, key, force)
		if errors.Is(err, outbox.ErrKeyInProgress) {
			return fmt.Errorf("%s:%s: %w (add --force to purge it anyway)", scope, key, err)
		}
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%s:%s: no such key", scope, key)
		}
		if c != nil {
			// The relay would do it; doing it now makes the purge visible at once.
			if _, err := c.Apply(ctx, k.CacheUpdate()); err != nil {
				fmt.Fprintf(stdout, "warning: Redis not updated now (the relay will): %v\n", err)
			}
		}
	default:
		return fmt.Errorf("unknown command %q: say show or purge", cmd)
	}
	view, err := showKey(ctx, pool, store, c, scope, key)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(view)
}

func showKey(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, c *cache.Cache, scope, key string) (keyView, error) {
	view := keyView{Scope: scope, Key: key}
	k, found, err := store.Get(ctx, pool, scope, key)
	if err != nil {
		return view, err
	}
	if found {
		row := &postgresRow{Status: string(k.Status), Version: k.Version, Fingerprint: k.Fingerprint, ExpiresInMs: k.ExpiresIn.Milliseconds()}
		if k.Status == outbox.StatusInProgress {
			lease := k.LeaseRemaining.Milliseconds()
			owner := fmt.Sprintf("%x", k.Owner)
			row.LeaseRemainingMs, row.Owner = &lease, &owner
		}
		if k.Status == outbox.StatusCompleted {
			n := len(k.Response.Body)
			row.ResponseStatus, row.ResponseBytes = &k.Response.Status, &n
		}
		view.Postgres = row
	}
	if c == nil {
		return view, nil
	}
	entry := &redisEntry{}
	e, inRedis, err := c.Read(ctx, scope, key)
	switch {
	case err != nil && !inRedis:
		entry.Error = err.Error()
	case err != nil:
		entry.Found, entry.Error = true, "value does not decode: "+err.Error()
	case inRedis:
		entry.Found, entry.State, entry.Version, entry.Provisional = true, string(e.State), e.Version, e.Provisional
		entry.BodyInPostgres, entry.ResponseStatus = e.BodyInPostgres, e.Response.Status
		if ttl, err := c.Client().PTTL(ctx, c.Key(scope, key)).Result(); err == nil && ttl > 0 {
			entry.TTLMs = ttl.Milliseconds()
		}
	}
	view.Redis = entry
	live := found && k.ExpiresIn > 0
	inSync := live == entry.Found && (!live || (entry.State == string(k.Status) && entry.Version == k.Version))
	view.InSync = &inSync
	return view, nil
}
