package cache_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// The keys, bodies and headers of bench/harness memory (the figure
// bench/compare.sh prints), so the numbers here and there agree.
var (
	benchBody        = []byte(fmt.Sprintf(`{"id":"pay_%0187d"}`, 0)) // 200 bytes
	benchFingerprint = "v1:" + strings.Repeat("00", 32)
	benchLocation    = http.Header{"Location": {"/v1/payments/pay_" + strings.Repeat("x", 24)}}
)

// benchCompleted is a completed key of scope acct_1234 as the harness writes it.
func benchCompleted(key string, body []byte, header http.Header) keystate.Key {
	return keystate.Key{Ref: keystate.Ref{Scope: "acct_1234", Key: key}, Version: 2, Status: keystate.Completed,
		Fingerprint: benchFingerprint, ExpiresIn: 24 * time.Hour,
		Response: keystate.Response{Status: 201, ContentType: "application/json", Body: body, Header: header}}
}

// memoryUsage returns Redis MEMORY USAGE of a completed key with a 200-byte
// body, with a Location header besides, of an in-progress key, and of a bare
// SET of the body under a key name of the same length: the harness's
// method. Besides, the same for a 2 KiB JSON body, deflated and not.
func memoryUsage(t *testing.T, ctx context.Context, rdb redis.UniversalClient, c *cache.Cache) map[string]int64 {
	t.Helper()
	usage := func(name string) int64 {
		n, err := rdb.MemoryUsage(ctx, name).Result()
		require.NoError(t, err)
		return n
	}
	out := map[string]int64{}
	for name, k := range map[string]keystate.Key{
		"completed_key_bytes":               benchCompleted("order-000000000001", benchBody, nil),
		"completed_key_with_location_bytes": benchCompleted("order-000000000004", benchBody, benchLocation),
		"completed_2k_json_key_bytes":       benchCompleted("order-000000000005", cache.CompressibleBody, nil),
		"in_progress_key_bytes": {Ref: keystate.Ref{Scope: "acct_1234", Key: "order-000000000002"}, Version: 1,
			Status: keystate.InProgress, Fingerprint: benchFingerprint, ExpiresIn: 24 * time.Hour,
			Owner: keystate.Owner{1}, LeaseRemaining: 30 * time.Second},
	} {
		_, err := c.Apply(ctx, k)
		require.NoError(t, err)
		out[name] = usage(c.Key(k.Ref))
	}
	bare := c.Key(keystate.Ref{Scope: "acct_1234", Key: "order-000000000003"})
	require.NoError(t, rdb.Set(ctx, bare, benchBody, 24*time.Hour).Err())
	out["bare_set_of_the_body_bytes"] = usage(bare)
	require.NoError(t, rdb.Set(ctx, bare, cache.CompressibleBody, 24*time.Hour).Err())
	out["bare_set_of_the_2k_json_bytes"] = usage(bare)
	plain := cache.New(rdb, cache.Options{Prefix: c.Prefix()})
	cache.SetCompressMin(plain, 0)
	k := benchCompleted("order-000000000006", cache.CompressibleBody, nil)
	_, err := plain.Apply(ctx, k)
	require.NoError(t, err)
	out["completed_2k_json_key_uncompressed_bytes"] = usage(c.Key(k.Ref))
	return out
}

// TestMemoryUsage holds the cache to issue 16's budget: a completed key with
// a 200-byte body costs at most 16 bytes more than a bare SET of the body.
func TestMemoryUsage(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	rdb, prefix := oncetest.Redis(t)
	usage := memoryUsage(t, ctx, rdb, cache.New(rdb, cache.Options{Prefix: prefix}))
	t.Logf("MEMORY USAGE (prefix of %d bytes): %v", len(prefix), usage)
	require.LessOrEqual(t, usage["completed_key_bytes"], usage["bare_set_of_the_body_bytes"]+16)
}

// benchSetup starts a Redis of the benchmark's own (so the server's CPU per
// operation can be read) and stores a completed key (with header, if any)
// and a bare SET of its body; it returns the cache, the key's ref and the
// bare key's name. Call report when the loop is done.
func benchSetup(b *testing.B, body []byte, header http.Header, compress bool) (ctx context.Context, c *cache.Cache, ref keystate.Ref, bare string, report func()) {
	b.Helper()
	ctx = oncetest.Context(b)
	rdb := oncetest.RedisClient(b, oncetest.NewRedisServer(b).URL())
	c = cache.New(rdb, cache.Options{Prefix: "mem:"})
	require.NoError(b, c.Load(ctx))
	if !compress {
		cache.SetCompressMin(c, 0)
	}
	k := benchCompleted("order-000000000001", body, header)
	_, err := c.Apply(ctx, k)
	require.NoError(b, err)
	bare = c.Key(keystate.Ref{Scope: "acct_1234", Key: "order-000000000003"})
	require.NoError(b, rdb.Set(ctx, bare, body, 24*time.Hour).Err())
	meter := startCPU(b, ctx, rdb)
	return ctx, c, k.Ref, bare, func() { meter.report(b) }
}

// cpuMeter measures the CPU time a benchmark costs the Redis server (INFO
// cpu) and this process (getrusage), reported per operation: on a machine
// shared with other work these are steadier than wall time.
type cpuMeter struct {
	ctx         context.Context
	rdb         redis.UniversalClient
	redis, self time.Duration
}

func startCPU(b *testing.B, ctx context.Context, rdb redis.UniversalClient) *cpuMeter {
	b.Helper()
	m := &cpuMeter{ctx: ctx, rdb: rdb}
	m.redis, m.self = m.read(b)
	return m
}

// read returns the CPU time used so far by the server and by this process.
func (m *cpuMeter) read(b *testing.B) (server, self time.Duration) {
	b.Helper()
	info, err := m.rdb.Info(m.ctx, "cpu").Result()
	require.NoError(b, err)
	for line := range strings.SplitSeq(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			f, err := strconv.ParseFloat(value, 64)
			require.NoError(b, err)
			server += time.Duration(f * float64(time.Second))
		}
	}
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return server, self
}

// report adds the CPU used since startCPU, per operation, to the results.
func (m *cpuMeter) report(b *testing.B) {
	if b.N == 0 {
		return
	}
	server, self := m.read(b)
	b.ReportMetric(float64(server-m.redis)/float64(b.N), "redis-cpu-ns/op")
	b.ReportMetric(float64(self-m.self)/float64(b.N), "client-cpu-ns/op")
}

// BenchmarkReplay compares a replay through Check (and through the check
// script alone, without the GET first) with a bare GET of the body through
// the same client, for a completed key with and without a stored Location
// header, and with a 2 KiB JSON body stored deflated and not.
func BenchmarkReplay(b *testing.B) {
	for _, hc := range []struct {
		name     string
		body     []byte
		header   http.Header
		compress bool
	}{
		{"200B", benchBody, nil, true},
		{"200B+Location", benchBody, benchLocation, true},
		{"2KiB-JSON", cache.CompressibleBody, nil, true},
		{"2KiB-JSON-uncompressed", cache.CompressibleBody, nil, false},
	} {
		for _, readFirst := range []bool{true, false} {
			name := hc.name + "/Check"
			if !readFirst {
				name += "ScriptOnly"
			}
			b.Run(name, func(b *testing.B) {
				ctx, c, ref, _, report := benchSetup(b, hc.body, hc.header, hc.compress)
				cache.SetReadFirst(c, readFirst)
				b.ReportAllocs()
				for b.Loop() {
					res, err := c.Check(ctx, ref, benchFingerprint, keystate.Owner{}, 30*time.Second)
					if err != nil || res.Verdict != cache.Replay {
						b.Fatalf("check: %v %v", res.Verdict, err)
					}
				}
				report()
			})
		}
		b.Run(hc.name+"/BareGet", func(b *testing.B) {
			ctx, c, _, bare, report := benchSetup(b, hc.body, hc.header, hc.compress)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Client().Get(ctx, bare).Bytes(); err != nil {
					b.Fatal(err)
				}
			}
			report()
		})
	}
}

// BenchmarkCheckMiss is a first execution's check: a key never seen, claimed
// provisionally (a lease of 5s keeps the claims from piling up), with and
// without the GET first.
func BenchmarkCheckMiss(b *testing.B) {
	for _, readFirst := range []bool{true, false} {
		b.Run(map[bool]string{true: "Check", false: "CheckScriptOnly"}[readFirst], func(b *testing.B) {
			ctx, c, _, _, report := benchSetup(b, benchBody, nil, true)
			cache.SetReadFirst(c, readFirst)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				ref := keystate.Ref{Scope: "acct_1234", Key: "miss-" + strconv.Itoa(i)}
				res, err := c.Check(ctx, ref, benchFingerprint, keystate.Owner{1}, 5*time.Second)
				if err != nil || res.Verdict != cache.Claimed {
					b.Fatalf("check: %v %v", res.Verdict, err)
				}
			}
			report()
		})
	}
}
