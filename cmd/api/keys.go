package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
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
	rdb := cache.NewClient(rdbOpts)
	if rdb != nil {
		defer rdb.Close()
	}
	engine, err := onceonly.New(onceonly.Config{Pool: pool, Redis: rdb, RedisPrefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	switch cmd {
	case "show":
	case "purge":
		switch err := engine.Purge(ctx, scope, key, force); {
		case errors.Is(err, onceonly.ErrKeyInProgress):
			return fmt.Errorf("%s:%s: %w (add --force to purge it anyway)", scope, key, err)
		case errors.Is(err, onceonly.ErrNoSuchKey):
			return fmt.Errorf("%s:%s: no such key", scope, key)
		case err != nil:
			return err
		}
	default:
		return fmt.Errorf("unknown command %q: say show or purge", cmd)
	}
	in, err := engine.Inspect(ctx, scope, key)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(viewOf(scope, key, in)); err != nil {
		return fmt.Errorf("write the key: %w", err)
	}
	return nil
}

// viewOf turns an inspection into what `api keys show` prints.
func viewOf(scope, key string, in onceonly.Inspection) keyView {
	view := keyView{Scope: scope, Key: key}
	if k := in.Postgres; k != nil {
		row := &postgresRow{Status: string(k.Status), Version: k.Version, Fingerprint: k.Fingerprint, ExpiresInMs: k.ExpiresIn.Milliseconds()}
		switch k.Status {
		case onceonly.StatusInProgress:
			lease := k.LeaseRemaining.Milliseconds()
			owner := k.Owner
			row.LeaseRemainingMs, row.Owner = &lease, &owner
		case onceonly.StatusCompleted:
			n := len(k.Response.Body)
			row.ResponseStatus, row.ResponseBytes = &k.Response.Status, &n
		case onceonly.StatusFailed:
		}
		view.Postgres = row
	}
	if !in.RedisEnabled {
		return view
	}
	entry := &redisEntry{}
	switch e := in.Redis; {
	case in.RedisErr != nil && !in.RedisFound:
		entry.Error = in.RedisErr.Error()
	case in.RedisErr != nil:
		entry.Found, entry.Error = true, "value does not decode: "+in.RedisErr.Error()
	case e != nil:
		entry.Found, entry.State, entry.Version, entry.Provisional = true, string(e.Status), e.Version, e.Provisional
		entry.BodyInPostgres, entry.ResponseStatus = e.BodyInPostgres, e.Response.Status
		entry.TTLMs = in.RedisTTL.Milliseconds()
	}
	view.Redis = entry
	inSync := in.InSync()
	view.InSync = &inSync
	return view
}
