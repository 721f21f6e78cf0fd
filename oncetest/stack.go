package oncetest

import (
	"context"
	"log/slog"
	"maps"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// Stack is what the daemon packages' tests run on: a database of the test's
// own, a Redis key prefix of its own, and the store and cache over them.
type Stack struct {
	Ctx   context.Context
	Pool  *pgxpool.Pool
	Redis redis.UniversalClient
	Cache *cache.Cache
	// Store keeps completed keys an hour and failed ones a minute.
	Store *outbox.Store
}

// StackOption changes what NewStack builds a Stack on.
type StackOption func(tb testing.TB, s *Stack)

// OnRedis puts the stack's cache on rdb (a server or cluster of the
// test's own, say) under a key prefix of the test's own, instead of on the
// shared test Redis.
func OnRedis(rdb redis.UniversalClient) StackOption {
	return func(tb testing.TB, s *Stack) {
		s.Redis = rdb
		s.Cache = cache.New(rdb, cache.Options{Prefix: KeyPrefix(tb, rdb)})
	}
}

// OnPool gives the stack pool (on PgBouncer, say, or on a database the
// test made) instead of a pool on a fresh database of its own.
func OnPool(pool *pgxpool.Pool) StackOption {
	return func(_ testing.TB, s *Stack) { s.Pool = pool }
}

// NewStack returns a Stack on a fresh database of the test's own and on the
// shared test Redis under a key prefix of the test's own, unless opts say
// otherwise.
func NewStack(tb testing.TB, opts ...StackOption) *Stack {
	tb.Helper()
	s := &Stack{
		Ctx:   Context(tb),
		Store: outbox.New(outbox.Config{CompletedTTL: time.Hour, FailedTTL: time.Minute}),
	}
	for _, opt := range opts {
		opt(tb, s)
	}
	if s.Pool == nil {
		s.Pool = DB(tb)
	}
	if s.Redis == nil {
		OnRedis(RedisClient(tb, RedisURL(tb)))(tb, s)
	}
	return s
}

// Configure fills in the daemon Config that cfg points to (the relay's,
// the reconciler's) what it takes from the stack: Pool, Redis and
// RedisPrefix, and, where cfg leaves them nil, Logger (QuietLogger) and
// Registerer (a registry of its own). The fields are set by name, as the
// daemons' Configs share them; a Config without one fails the test.
func (s *Stack) Configure(tb testing.TB, cfg any) {
	tb.Helper()
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		tb.Fatalf("Configure takes a pointer to a Config struct, not %T", cfg)
	}
	set := func(name string, value any, onlyIfNil bool) {
		f := v.Elem().FieldByName(name)
		if !f.IsValid() || !f.CanSet() || !reflect.TypeOf(value).AssignableTo(f.Type()) {
			tb.Fatalf("%T has no field %s of a type that takes %T", cfg, name, value)
		}
		if !onlyIfNil || f.IsNil() {
			f.Set(reflect.ValueOf(value))
		}
	}
	set("Pool", s.Pool, false)
	set("Redis", s.Redis, false)
	set("RedisPrefix", s.Cache.Prefix(), false)
	set("Logger", QuietLogger(), true)
	set("Registerer", prometheus.NewRegistry(), true)
}

// RequireConverged checks that the stack's Redis holds every live key of
// its database at the key's state and version (see RequireConverged).
func (s *Stack) RequireConverged(tb testing.TB) {
	tb.Helper()
	RequireConverged(tb, s.Ctx, s.Pool, s.Cache, "%")
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
	return NewStack(tb, OnRedis(c.Client(tb))), c
}
