package cache_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

// layout1Cases are completed responses as the release before layout 2
// stored them; they must still replay.
var layout1Cases = []struct {
	name  string
	r     keystate.Response
	large bool
}{
	{"JSON", keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"pay_1"}`)}, false},
	{"NoContentType", keystate.Response{Status: 200, Body: []byte("raw")}, false},
	{"OtherContentType", keystate.Response{Status: 402, ContentType: "text/plain; charset=utf-8", Body: []byte("declined")}, false},
	{"Headers", keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"pay_1"}`),
		Header: http.Header{"Location": {"/v1/payments/pay_1"}, "X-Multi": {"a", "b: c"}}}, false},
	{"BodyInPostgres", keystate.Response{Status: 201}, true},
}

// TestLayout1ValuesStillAnswer stores values in the previous layout by
// hand: the check (with and without the GET first), Read and ReadHeaders
// still read them.
func TestLayout1ValuesStillAnswer(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, tc := range layout1Cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, rdb)
				ref := keystate.Ref{Scope: "s", Key: "k"}
				require.NoError(t, b.rdb.Set(b.ctx, b.cache.Key(ref), cache.EncodeLayout1(3, fp1, tc.r, tc.large), time.Minute).Err())
				for _, readFirst := range []bool{true, false} {
					cache.SetReadFirst(b.cache, readFirst)
					res, err := b.cache.Check(b.ctx, ref, fp1, ownerB, time.Minute)
					require.NoError(t, err)
					require.Equal(t, cache.Replay, res.Verdict, "read first: %v", readFirst)
					require.Equal(t, tc.large, res.Entry.BodyInPostgres)
					require.Equal(t, tc.r, res.Entry.Response)
					require.EqualValues(t, 3, res.Entry.Version)

					res, err = b.cache.Check(b.ctx, ref, fp2, ownerB, time.Minute)
					require.NoError(t, err)
					require.Equal(t, cache.Mismatch, res.Verdict, "read first: %v", readFirst)
				}
				e := b.read(t, "k")
				require.Equal(t, cache.Digest(fp1), e.Digest, "the engine compares Read's digest with Digest")
				h := b.header(t, "k")
				require.False(t, h.Corrupt)
				require.Equal(t, keystate.Completed, h.State)
				require.EqualValues(t, 3, h.Version)
			})
		}
	})
}

// evalCalls returns how many scripts the server has run (EVALSHA and EVAL).
func evalCalls(t *testing.T, ctx context.Context, rdb redis.UniversalClient) int {
	t.Helper()
	info, err := rdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	n := 0
	for line := range strings.SplitSeq(info, "\r\n") {
		name, stats, _ := strings.Cut(line, ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, err := strconv.Atoi(calls)
		require.NoError(t, err)
		n += c
	}
	return n
}

// TestCheckAnswersCompletedWithoutScript counts the scripts a private
// server runs: a completed key is answered from the GET alone (a replay, a
// replay whose body is in Postgres, a value of the previous layout, another
// fingerprint's Mismatch), and everything else still goes to the script.
func TestCheckAnswersCompletedWithoutScript(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	rdb := oncetest.RedisClient(t, oncetest.NewRedisServer(t).URL())
	c := cache.New(rdb, cache.Options{Prefix: "p:", MaxBody: 64})
	require.True(t, cache.ReadFirst(c))
	require.NoError(t, c.Load(ctx))
	ref := func(key string) keystate.Ref { return keystate.Ref{Scope: "s", Key: key} }
	apply := func(k keystate.Key) {
		t.Helper()
		k.ExpiresIn = time.Hour
		_, err := c.Apply(ctx, k)
		require.NoError(t, err)
	}
	apply(keystate.Key{Ref: ref("done"), Version: 2, Status: keystate.Completed, Fingerprint: fp1,
		Response: keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{}`)}})
	apply(keystate.Key{Ref: ref("large"), Version: 2, Status: keystate.Completed, Fingerprint: fp1,
		Response: keystate.Response{Status: 201, Body: []byte(strings.Repeat("x", 65))}})
	require.NoError(t, rdb.Set(ctx, c.Key(ref("old")), cache.EncodeLayout1(2, fp1, keystate.Response{Status: 200, Body: []byte("b")}, false), time.Hour).Err())
	apply(keystate.Key{Ref: ref("live"), Version: 1, Status: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: time.Minute})
	apply(keystate.Key{Ref: ref("failed"), Version: 3, Status: keystate.Failed, Fingerprint: fp1})
	require.NoError(t, rdb.Set(ctx, c.Key(ref("junk")), "completed:x:junk", time.Hour).Err())
	require.NoError(t, rdb.HSet(ctx, c.Key(ref("hash")), "state", "completed").Err())

	for _, tc := range []struct {
		key    string
		fp     string
		want   cache.Verdict
		script bool
	}{
		{"done", fp1, cache.Replay, false},
		{"done", fp2, cache.Mismatch, false},
		{"large", fp1, cache.Replay, false},
		{"old", fp1, cache.Replay, false},
		{"old", fp2, cache.Mismatch, false},
		{"absent", fp1, cache.Claimed, true},
		{"live", fp1, cache.InFlight, true},
		{"live", fp2, cache.Mismatch, true},
		{"failed", fp1, cache.Claimed, true},
		{"junk", fp1, cache.Claimed, true},
		{"hash", fp1, cache.Claimed, true},
	} {
		before := evalCalls(t, ctx, rdb)
		res, err := c.Check(ctx, ref(tc.key), tc.fp, ownerB, time.Minute)
		require.NoError(t, err, tc.key)
		require.Equal(t, tc.want, res.Verdict, "%s %s", tc.key, tc.fp)
		ran := evalCalls(t, ctx, rdb) - before
		if tc.script {
			require.Equal(t, 1, ran, "%s %s goes to the script", tc.key, tc.fp)
		} else {
			require.Zero(t, ran, "%s %s is answered without a script", tc.key, tc.fp)
		}
	}
}

// TestReplicaReadsTurnReadFirstOff: a client that may send GET to a
// replica checks with the script alone (a replica may still hold a value
// its master deleted).
func TestReplicaReadsTurnReadFirstOff(t *testing.T) {
	t.Parallel()
	for _, opts := range []*redis.ClusterOptions{
		{Addrs: []string{"127.0.0.1:1"}, ReadOnly: true},
		{Addrs: []string{"127.0.0.1:1"}, RouteByLatency: true},
		{Addrs: []string{"127.0.0.1:1"}, RouteRandomly: true},
	} {
		cc := redis.NewClusterClient(opts)
		require.False(t, cache.ReadFirst(cache.New(cc, cache.Options{})))
		require.NoError(t, cc.Close())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	require.True(t, cache.ReadFirst(cache.New(cc, cache.Options{})))
	require.NoError(t, cc.Close())
}

// TestCheckPathsAgree stores the same value under two keys and checks one
// with the GET first and the other with the script alone: verdicts,
// entries, errors and what each left in Redis agree, for values of both
// layouts in every state, cut short at many lengths, and foreign ones.
func TestCheckPathsAgree(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		script := cache.New(rdb, cache.Options{Prefix: b.cache.Prefix(), MaxBody: 64})
		cache.SetReadFirst(script, false)
		ref := func(key string) keystate.Ref { return keystate.Ref{Scope: "s", Key: key} }

		// Values as the code writes them, read back raw.
		var values []string
		store := func(k keystate.Key) {
			k.Ref, k.ExpiresIn = ref("src"), time.Hour
			_, err := b.cache.Apply(b.ctx, k)
			require.NoError(t, err)
			values = append(values, b.rdb.Get(b.ctx, b.cache.Key(k.Ref)).Val())
			require.NoError(t, b.rdb.Del(b.ctx, b.cache.Key(k.Ref)).Err())
		}
		body := `{"id":"pay_` + strings.Repeat("0", 40) + `"}`
		for _, status := range []int{201, 402, 612} {
			store(keystate.Key{Version: 2, Status: keystate.Completed, Fingerprint: fp1,
				Response: keystate.Response{Status: status, ContentType: "application/json", Body: []byte(body)}})
		}
		store(keystate.Key{Version: 2, Status: keystate.Completed, Fingerprint: fp1,
			Response: keystate.Response{Status: 201, ContentType: "application/x-thing", Body: []byte("b"),
				Header: http.Header{"Location": {"/v1/payments/pay_1"}, "X-Other": {"a", "b"}}}})
		store(keystate.Key{Version: 2, Status: keystate.Completed, Fingerprint: fp1,
			Response: keystate.Response{Status: 201, Body: []byte(strings.Repeat("x", 65))}})
		store(keystate.Key{Version: 4, Status: keystate.Failed, Fingerprint: fp1})
		store(keystate.Key{Version: 1, Status: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: time.Minute})
		store(keystate.Key{Version: 1, Status: keystate.InProgress, Fingerprint: fp1, Owner: ownerA})
		for _, tc := range layout1Cases {
			values = append(values, string(cache.EncodeLayout1(3, fp1, tc.r, tc.large)))
		}
		_, err := b.cache.Check(b.ctx, ref("src"), fp1, ownerA, time.Minute)
		require.NoError(t, err)
		values = append(values, b.rdb.Get(b.ctx, b.cache.Key(ref("src"))).Val()) // a provisional claim
		values = append(values, "", "garbage", "completed:2:", "completed:2:\x80", "completed:-1:cxxxxxxxx201\n")

		// Every value cut short at every length up to 40 and some beyond.
		var cases []string
		for _, v := range values {
			for n := 0; n <= len(v); n++ {
				if n <= 40 || n%13 == 0 || n == len(v) {
					cases = append(cases, v[:n])
				}
			}
		}
		for i, v := range cases {
			for _, fp := range []string{fp1, fp2} {
				fast, slow := ref("fast"+strconv.Itoa(i)+fp), ref("slow"+strconv.Itoa(i)+fp)
				require.NoError(t, b.rdb.Set(b.ctx, b.cache.Key(fast), v, time.Hour).Err())
				require.NoError(t, b.rdb.Set(b.ctx, b.cache.Key(slow), v, time.Hour).Err())
				got, gotErr := b.cache.Check(b.ctx, fast, fp, ownerB, time.Minute)
				want, wantErr := script.Check(b.ctx, slow, fp, ownerB, time.Minute)
				require.Equal(t, wantErr != nil, gotErr != nil, "%q %s: %v %v", v, fp, gotErr, wantErr)
				require.Equal(t, want.Verdict, got.Verdict, "%q %s", v, fp)
				require.Equal(t, want.Entry, got.Entry, "%q %s", v, fp)
				require.InDelta(t, want.RetryAfter, got.RetryAfter, float64(time.Second), "%q %s", v, fp)
				a, c := b.header(t, fast.Key), b.header(t, slow.Key)
				require.Equal(t, []any{c.Found, c.Corrupt, c.State, c.Version, c.Provisional}, []any{a.Found, a.Corrupt, a.State, a.Version, a.Provisional}, "%q %s", v, fp)
			}
		}
	})
}

// TestCompressMin: with CompressMin a large compressible body is stored
// deflated and replays as it was; by default it is stored as is; either
// cache reads both.
func TestCompressMin(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	rdb, prefix := oncetest.Redis(t)
	deflating := cache.New(rdb, cache.Options{Prefix: prefix, CompressMin: cache.DefaultCompressMin})
	plain := cache.New(rdb, cache.Options{Prefix: prefix})
	r := keystate.Response{Status: 200, ContentType: "application/json", Body: cache.CompressibleBody}
	sizes := map[string]int{}
	for name, c := range map[string]*cache.Cache{"deflated": deflating, "plain": plain} {
		k := keystate.Key{Ref: keystate.Ref{Scope: "s", Key: name}, Version: 2, Status: keystate.Completed,
			Fingerprint: fp1, ExpiresIn: time.Minute, Response: r}
		_, err := c.Apply(ctx, k)
		require.NoError(t, err)
		sizes[name] = len(rdb.Get(ctx, c.Key(k.Ref)).Val())
		for _, reader := range []*cache.Cache{deflating, plain} {
			res, err := reader.Check(ctx, k.Ref, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.Equal(t, r, res.Entry.Response)
		}
	}
	require.Less(t, sizes["deflated"], sizes["plain"]/2)
	require.Greater(t, sizes["plain"], len(cache.CompressibleBody))
}

// layout1Bytes are the values the release before layout 2 wrote for
// layout1Cases at version 3 with fp1, taken from its encoder.
var layout1Bytes = map[string]string{
	"JSON":             "completed:3:cH$\x1a\x9d\xcb\xffq\x02201\n{\"id\":\"pay_1\"}",
	"NoContentType":    "completed:3:cH$\x1a\x9d\xcb\xffq\x02200-\nraw",
	"OtherContentType": "completed:3:cH$\x1a\x9d\xcb\xffq\x02402text/plain; charset=utf-8\ndeclined",
	"Headers":          "completed:3:hH$\x1a\x9d\xcb\xffq\x02201\n54\nLocation: /v1/payments/pay_1\nX-Multi: a\nX-Multi: b: c\n{\"id\":\"pay_1\"}",
	"BodyInPostgres":   "completed:3:mH$\x1a\x9d\xcb\xffq\x02201",
}

// TestWriteLayout1 is the rolling upgrade from a release before layout 2:
// with Options.WriteLayout1 the cache writes completed values byte for byte
// as that release did (so its processes replay them), and reads them back.
func TestWriteLayout1(t *testing.T) {
	t.Parallel()
	for _, tc := range layout1Cases {
		require.Equal(t, layout1Bytes[tc.name], string(cache.EncodeLayout1(3, fp1, tc.r, tc.large)), tc.name)
	}
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, tc := range layout1Cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				c := cache.New(rdb, cache.Options{Prefix: oncetest.KeyPrefix(t, rdb), WriteLayout1: true})
				ctx := oncetest.Context(t)
				ref := keystate.Ref{Scope: "s", Key: "k"}
				applied, err := c.Apply(ctx, keystate.Key{Ref: ref, Version: 3, Status: keystate.Completed, Fingerprint: fp1,
					ExpiresIn: time.Minute, Response: tc.r, BodyOmitted: tc.large})
				require.NoError(t, err)
				require.True(t, applied)
				stored, err := rdb.Get(ctx, c.Key(ref)).Bytes()
				require.NoError(t, err)
				require.Equal(t, layout1Bytes[tc.name], string(stored))

				res, err := c.Check(ctx, ref, fp1, ownerB, time.Minute)
				require.NoError(t, err)
				require.Equal(t, cache.Replay, res.Verdict)
				require.Equal(t, tc.r, res.Entry.Response)
			})
		}
	})
}
