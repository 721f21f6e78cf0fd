package testenv

import (
	"context"
	"log/slog"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/internal/cache"
	"github.com/onceonly/onceonly/internal/keystate"
	"github.com/onceonly/onceonly/internal/keystore"
)

// Stack is what the daemon packages' tests run on: a database of the test's
// own, a Redis key prefix of its own, and the store and cache over them.
type Stack struct {
	Ctx   context.Context
	Pool  *pgxpool.Pool
	Redis redis.UniversalClient
	Cache *cache.Cache
	// Store keeps completed keys an hour and failed ones a minute.
	Store *keystore.Store
}

// NewStack returns a Stack on the shared test servers.
func NewStack(tb testing.TB) *Stack {
	tb.Helper()
	rdb, prefix := Redis(tb)
	return NewStackOn(tb, rdb, prefix)
}

// NewStackOn returns a Stack whose cache uses rdb and prefix (a private
// Redis server, say).
func NewStackOn(tb testing.TB, rdb redis.UniversalClient, prefix string) *Stack {
	tb.Helper()
	return &Stack{
		Ctx:   Context(tb),
		Pool:  DB(tb),
		Redis: rdb,
		Cache: cache.New(rdb, cache.Options{Prefix: prefix}),
		Store: keystore.New(keystore.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute}),
	}
}

// Complete runs (scope, key) through claim and complete in Postgres only,
// with body as the stored response.
func (s *Stack) Complete(tb testing.TB, scope, key, body string) {
	tb.Helper()
	owner := keystate.Owner{0xc0}
	ref := keystate.Ref{Scope: scope, Key: key}
	if _, err := s.Store.Claim(s.Ctx, s.Pool, ref, "v1:fp", owner, time.Minute); err != nil {
		tb.Fatalf("claim %s: %v", key, err)
	}
	if _, err := s.Store.Complete(s.Ctx, s.Pool, ref, owner, keystate.Response{Status: 201, Body: []byte(body)}); err != nil {
		tb.Fatalf("complete %s: %v", key, err)
	}
}

// CompleteKeys completes n keys, name0 … name<n-1>, in scope (see Complete);
// each stored body names its key.
func (s *Stack) CompleteKeys(tb testing.TB, scope, name string, n int) {
	tb.Helper()
	for i := range n {
		key := name + strconv.Itoa(i)
		s.Complete(tb, scope, key, `{"key":"`+key+`"}`)
	}
}

// QuietLogger returns a logger that drops everything, for components whose
// expected warnings would clutter test output.
func QuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// EnvWith returns a copy of base with k set to v.
func EnvWith(base map[string]string, k, v string) map[string]string {
	env := make(map[string]string, len(base)+1)
	maps.Copy(env, base)
	env[k] = v
	return env
}

// NewClusterStack returns a Stack on a Redis Cluster of the test's own, with
// the cluster, for tests that stop, restart or reshard its masters.
func NewClusterStack(tb testing.TB) (*Stack, *RedisCluster) {
	tb.Helper()
	c := NewRedisCluster(tb)
	rdb := c.Client(tb)
	return NewStackOn(tb, rdb, KeyPrefix(tb, rdb)), c
}
