package cache_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
)

type testBundle struct {
	ctx   context.Context
	rdb   redis.UniversalClient
	cache *cache.Cache
}

// setup returns a cache on rdb under a key prefix of the test's own.
func setup(t *testing.T, rdb redis.UniversalClient) *testBundle {
	t.Helper()
	return &testBundle{
		ctx:   oncetest.Context(t),
		rdb:   rdb,
		cache: cache.New(rdb, cache.Options{Prefix: oncetest.KeyPrefix(t, rdb), MaxBody: 64}),
	}
}

var (
	ownerA = keystate.Owner{'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'}
	ownerB = keystate.Owner{'b', 0, ':', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b', 'b'}
)

const (
	fp1 = "v1:1111"
	fp2 = "v1:2222"
)

func (b *testBundle) read(t *testing.T, key string) cache.Entry {
	t.Helper()
	e, found, err := b.cache.Read(b.ctx, keystate.Ref{Scope: "s", Key: key})
	require.NoError(t, err)
	require.True(t, found, "key %s is missing", key)
	return e
}

// update is a test's write into the cache: a key's state in scope "s" (an
// hour to live unless TTL says otherwise), or its deletion, optionally as a
// compare-and-set against Expect.
type update struct {
	Key            string
	Version        int64
	State          keystate.Status
	Fingerprint    string
	TTL            time.Duration
	Owner          keystate.Owner
	LeaseRemaining time.Duration
	Response       keystate.Response
	Deleted        bool
	Expect         string
}

// state returns the key state u writes.
func (u update) state() keystate.Key {
	ref := keystate.Ref{Scope: "s", Key: u.Key}
	if u.Deleted {
		return keystate.Gone(ref, u.Version)
	}
	if u.TTL == 0 {
		u.TTL = time.Hour
	}
	return keystate.Key{Ref: ref, Version: u.Version, Status: u.State, Fingerprint: u.Fingerprint, ExpiresIn: u.TTL,
		Owner: u.Owner, LeaseRemaining: u.LeaseRemaining, Response: u.Response}
}

func (b *testBundle) apply(t *testing.T, u update) bool {
	t.Helper()
	if u.Expect == "" {
		applied, err := b.cache.Apply(b.ctx, u.state())
		require.NoError(t, err)
		return applied
	}
	res, err := b.cache.RepairBatch(b.ctx, []keystate.Key{u.state()}, []string{u.Expect})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	return res[0].Applied
}

func completed(key string, version int64, body string) update {
	return update{Key: key, Version: version, State: keystate.Completed, Fingerprint: fp1,
		Response: keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(body)}}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("MissClaimsProvisionally", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Claimed, res.Verdict)
			e := b.read(t, "k")
			require.Equal(t, keystate.InProgress, e.State)
			require.True(t, e.Provisional)
			require.Equal(t, int64(0), e.Version)
			require.Equal(t, ownerA, e.Owner)
			require.Equal(t, cache.Digest(fp1), e.Digest)
			ttl := b.rdb.PTTL(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"})).Val()
			require.Greater(t, ttl, 50*time.Second)
			require.LessOrEqual(t, ttl, time.Minute)
			raw := b.rdb.Get(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"})).Val()
			require.True(t, strings.HasPrefix(raw, "in_progress:0:"), raw)
		})

		t.Run("LiveClaimIsInFlightForAnyFingerprint", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			_, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
			require.NoError(t, err)
			for _, fp := range []string{fp1, fp2} {
				res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp, ownerB, time.Minute)
				require.NoError(t, err)
				require.Equal(t, cache.InFlight, res.Verdict, fp)
				require.Greater(t, res.RetryAfter, 50*time.Second)
				require.LessOrEqual(t, res.RetryAfter, time.Minute)
			}
			require.Equal(t, ownerA, b.read(t, "k").Owner)
		})

		t.Run("OwnClaimCheckedAgainIsClaimed", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			// A client that retries a check whose reply it lost runs it twice.
			for range 2 {
				res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
				require.NoError(t, err)
				require.Equal(t, cache.Claimed, res.Verdict)
			}
			require.Equal(t, ownerA, b.read(t, "k").Owner)
		})

		t.Run("ExpiredProvisionalClaimIsTakenOver", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			// The lease ends before the key's TTL would: set a long TTL by
			// hand. (The claim's PX is its lease: a 1 ms lease could expire
			// the key before the test read it.)
			const lease = 300 * time.Millisecond
			_, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, lease)
			require.NoError(t, err)
			extended, err := b.rdb.PExpire(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"}), time.Minute).Result()
			require.NoError(t, err)
			require.True(t, extended, "the claim outlived its lease before the test could extend it")
			oncetest.AwaitCacheLeaseOver(t, b.ctx, b.cache, keystate.Ref{Scope: "s", Key: "k"})
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp2, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Claimed, res.Verdict)
			e := b.read(t, "k")
			require.Equal(t, ownerB, e.Owner)
			require.Equal(t, cache.Digest(fp2), e.Digest)
		})

		t.Run("ConfirmedClaim", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, update{Key: "live", Version: 3, State: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: time.Minute})
			b.apply(t, update{Key: "dead", Version: 3, State: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: 0})

			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "live"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.InFlight, res.Verdict)

			res, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "live"}, fp2, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Mismatch, res.Verdict, "Postgres confirmed fp1 for this key")

			res, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "dead"}, fp2, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Mismatch, res.Verdict)

			res, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "dead"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Claimed, res.Verdict, "an expired lease is taken over")
			e := b.read(t, "dead")
			require.True(t, e.Provisional)
			require.Equal(t, int64(3), e.Version, "a takeover keeps the Postgres version")
			require.Equal(t, ownerB, e.Owner)
		})

		t.Run("Completed", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			body := `{"id":"pay_1","note":"colons: and\nnewlines"}`
			b.apply(t, completed("k", 2, body))
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.Equal(t, 201, res.Entry.Response.Status)
			require.Equal(t, "application/json", res.Entry.Response.ContentType)
			require.Equal(t, body, string(res.Entry.Response.Body))
			require.False(t, res.Entry.BodyInPostgres)

			res, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp2, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Mismatch, res.Verdict)
			require.Equal(t, keystate.Completed, b.read(t, "k").State, "a mismatch changes nothing")
		})

		t.Run("CompletedOtherContentType", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			u := completed("k", 2, "plain")
			u.Response.ContentType = "text/plain; charset=utf-8"
			u.Response.Status = 402
			b.apply(t, u)
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.Equal(t, u.Response, res.Entry.Response)
		})

		t.Run("CompletedWithoutContentType", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			u := completed("k", 2, "raw")
			u.Response.ContentType = "" // the handler set none: replayed with none (I2)
			b.apply(t, u)
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.Equal(t, u.Response, res.Entry.Response)
		})

		t.Run("CompletedWithHeaders", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			u := completed("k", 2, `{"id":"pay_1"}`)
			u.Response.Header = http.Header{"Location": {"/v1/payments/pay_1"}, "X-Multi": {"a", "b: c"}}
			b.apply(t, u)
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.Equal(t, u.Response, res.Entry.Response, "status, type, every header value and the body come back")
		})

		t.Run("CompletedLargeBodyIsAMarker", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, completed("k", 2, strings.Repeat("x", 65)))
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Replay, res.Verdict)
			require.True(t, res.Entry.BodyInPostgres)
			require.Equal(t, 201, res.Entry.Response.Status)
			require.Nil(t, res.Entry.Response.Body)
			require.Less(t, len(b.rdb.Get(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"})).Val()), 40)
		})

		t.Run("Failed", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, update{Key: "k", Version: 4, State: keystate.Failed, Fingerprint: fp1})
			res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp2, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Mismatch, res.Verdict, "a failed key stays bound to its payload")

			res, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerB, time.Minute)
			require.NoError(t, err)
			require.Equal(t, cache.Claimed, res.Verdict)
			e := b.read(t, "k")
			require.Equal(t, keystate.InProgress, e.State)
			require.Equal(t, int64(4), e.Version)
			require.True(t, e.Provisional)
		})

		t.Run("UndecodableValueIsAMiss", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			k := b.cache.Key(keystate.Ref{Scope: "s", Key: "k"})
			for _, corrupt := range []func(){
				func() { b.rdb.Set(b.ctx, k, "garbage", 0) },
				func() { b.rdb.Set(b.ctx, k, "completed:x:c", 0) },
				func() { b.rdb.Set(b.ctx, k, "completed:2:c123", 0) },
				func() { b.rdb.Del(b.ctx, k); b.rdb.HSet(b.ctx, k, "state", "completed") },
			} {
				corrupt()
				res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
				require.NoError(t, err)
				require.Equal(t, cache.Claimed, res.Verdict)
				require.True(t, b.read(t, "k").Provisional)
			}
		})
	})
}

func TestApply(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("OnlyAHigherVersionWins", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			require.True(t, b.apply(t, completed("k", 5, "five")))
			require.False(t, b.apply(t, completed("k", 4, "four")), "lower")
			require.False(t, b.apply(t, completed("k", 5, "five again")), "same version")
			require.Equal(t, "five", string(b.read(t, "k").Response.Body))
			require.True(t, b.apply(t, update{Key: "k", Version: 6, State: keystate.Failed, Fingerprint: fp1}))
			require.Equal(t, keystate.Failed, b.read(t, "k").State)
		})

		t.Run("ConfirmsAProvisionalClaimOfTheSameVersion", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			_, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
			require.NoError(t, err)
			// Postgres answered that the key failed at version 0? Versions start at
			// 1, so the provisional claim (version 0) always yields to Postgres.
			require.True(t, b.apply(t, update{Key: "k", Version: 1, State: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: time.Minute}))
			e := b.read(t, "k")
			require.False(t, e.Provisional)
			require.Equal(t, int64(1), e.Version)

			b.apply(t, update{Key: "f", Version: 3, State: keystate.Failed, Fingerprint: fp1})
			_, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "f"}, fp1, ownerA, time.Minute)
			require.NoError(t, err)
			require.True(t, b.read(t, "f").Provisional)
			require.True(t, b.apply(t, update{Key: "f", Version: 3, State: keystate.Failed, Fingerprint: fp1}),
				"a Postgres version replaces a provisional claim of the same version")
			require.False(t, b.read(t, "f").Provisional)
		})

		t.Run("InProgressLeaseUsesRedisTime", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, update{Key: "k", Version: 1, State: keystate.InProgress, Fingerprint: fp1, Owner: ownerB, LeaseRemaining: 30 * time.Second})
			tm, err := b.rdb.Time(b.ctx).Result()
			require.NoError(t, err)
			e := b.read(t, "k")
			require.Equal(t, ownerB, e.Owner)
			require.InDelta(t, tm.UnixMilli()+30_000, e.LeaseUntilMs, 2000)
		})

		t.Run("TTLFollowsPostgresExpiry", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			u := completed("k", 1, "b")
			u.TTL = 90 * time.Second
			b.apply(t, u)
			ttl := b.rdb.PTTL(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"})).Val()
			require.InDelta(t, float64(90*time.Second), float64(ttl), float64(2*time.Second))
		})

		t.Run("DeleteAndExpired", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, completed("k", 5, "b"))
			require.False(t, b.apply(t, update{Key: "k", Version: 4, Deleted: true}), "older delete")
			require.True(t, b.apply(t, update{Key: "k", Version: 6, Deleted: true}))
			_, found, err := b.cache.Read(b.ctx, keystate.Ref{Scope: "s", Key: "k"})
			require.NoError(t, err)
			require.False(t, found)

			b.apply(t, completed("e", 1, "b"))
			u := completed("e", 2, "b")
			u.TTL = -time.Second
			require.True(t, b.apply(t, u))
			require.Zero(t, b.rdb.Exists(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "e"})).Val(), "a key past its Postgres expiry is dropped")
		})

		t.Run("OverwritesUndecodable", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.rdb.HSet(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "k"}), "x", "y")
			require.True(t, b.apply(t, completed("k", 1, "b")))
			require.Equal(t, "b", string(b.read(t, "k").Response.Body))
		})

		t.Run("RejectsBadInputWithoutCallingRedis", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			_, err := b.cache.Apply(b.ctx, update{Key: "k", Version: 1, State: "weird", TTL: time.Hour}.state())
			require.ErrorContains(t, err, "unknown state")
			_, err = b.cache.Apply(b.ctx, update{Key: "k", Version: 1, State: keystate.Completed, TTL: time.Hour}.state())
			require.ErrorContains(t, err, "out of range")
		})

		t.Run("Batch", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			require.NoError(t, b.rdb.ScriptFlush(b.ctx).Err()) // EVALSHA must survive an empty script cache
			b.apply(t, completed("k3", 9, "newer"))
			updates := make([]keystate.Key, 0, 4)
			for _, k := range []string{"k1", "k2", "k3"} {
				updates = append(updates, completed(k, 2, "v2").state())
			}
			updates = append(updates, update{Key: "bad", Version: 1, State: "weird", TTL: time.Hour}.state())
			res, err := b.cache.ApplyBatch(b.ctx, updates)
			require.NoError(t, err)
			require.True(t, res[0].Applied)
			require.True(t, res[1].Applied)
			require.False(t, res[2].Applied)
			require.NoError(t, res[2].Err)
			require.Error(t, res[3].Err)
			require.Equal(t, "newer", string(b.read(t, "k3").Response.Body))
		})
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		_, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, ownerA, time.Minute)
		require.NoError(t, err)

		released, err := b.cache.Release(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, ownerB)
		require.NoError(t, err)
		require.False(t, released, "another owner's claim")

		released, err = b.cache.Release(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, ownerA)
		require.NoError(t, err)
		require.True(t, released)

		released, err = b.cache.Release(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, ownerA)
		require.NoError(t, err)
		require.False(t, released, "absent")

		b.apply(t, update{Key: "c", Version: 1, State: keystate.InProgress, Fingerprint: fp1, Owner: ownerA, LeaseRemaining: time.Minute})
		released, err = b.cache.Release(b.ctx, keystate.Ref{Scope: "s", Key: "c"}, ownerA)
		require.NoError(t, err)
		require.False(t, released, "a claim Postgres confirmed is left to the versioned apply")
	})
}

// TestCheckHammer sends many concurrent checks for one key: exactly one wins
// the claim, the rest see it in flight.
func TestCheckHammer(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		var claimed, inFlight atomic.Int32
		var wg sync.WaitGroup
		for i := range 200 {
			owner := keystate.Owner{byte(i), byte(i >> 8)}
			wg.Go(func() {
				res, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "k"}, fp1, owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Verdict {
				case cache.Claimed:
					claimed.Add(1)
				case cache.InFlight:
					inFlight.Add(1)
				case cache.Replay, cache.Mismatch, cache.Undecided:
					t.Errorf("a concurrent check of an unfinished key got %v", res.Verdict)
				}
			})
		}
		wg.Wait()
		require.Equal(t, int32(1), claimed.Load())
		require.Equal(t, int32(199), inFlight.Load())
	})
}

// TestApplyNeverRegresses delivers every version of a key many times, out of
// order and concurrently: the cache ends at the highest.
func TestApplyNeverRegresses(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		var wg sync.WaitGroup
		for worker := range 8 {
			wg.Go(func() {
				for i := range 100 {
					v := int64((i*7+worker*13)%100 + 1)
					if _, err := b.cache.Apply(b.ctx, completed("k", v, "x").state()); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		require.Equal(t, int64(100), b.read(t, "k").Version)
	})
}

func TestKeyNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "idem:acct_1:k:with:colons", cache.KeyName("idem:", keystate.Ref{Scope: "acct_1", Key: "k:with:colons"}))
	ref, ok := cache.SplitKeyName("idem:", "idem:acct_1:k:with:colons")
	require.True(t, ok)
	require.Equal(t, "acct_1", ref.Scope)
	require.Equal(t, "k:with:colons", ref.Key)
	for _, bad := range []string{"other:a:b", "idem:", "idem:nokey", "idem::k", "idem:s:"} {
		_, ok := cache.SplitKeyName("idem:", bad)
		require.False(t, ok, bad)
	}
}

// header reads the header of one key of the test's scope.
func (b *testBundle) header(t *testing.T, key string) cache.Header {
	t.Helper()
	h, err := b.cache.ReadHeaders(b.ctx, []string{b.cache.Key(keystate.Ref{Scope: "s", Key: key})})
	require.NoError(t, err)
	return h[0]
}

func TestCompareAndSetApply(t *testing.T) {
	t.Parallel()
	oncetest.OnEachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("MatchWritesWhateverTheVersion", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, completed("k", 9, "wrong"))
			h := b.header(t, "k")
			require.Equal(t, keystate.Completed, h.State)
			require.EqualValues(t, 9, h.Version)
			u := update{Key: "k", Version: 3, State: keystate.Failed, Fingerprint: fp1, Expect: h.Expect()}
			require.True(t, b.apply(t, u), "the reconciler may lower a version Postgres never had")
			require.EqualValues(t, 3, b.read(t, "k").Version)
		})

		t.Run("MismatchIsRefused", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			b.apply(t, completed("k", 4, "seen"))
			h := b.header(t, "k")
			b.apply(t, completed("k", 5, "written meanwhile"))
			require.False(t, b.apply(t, update{Key: "k", Version: 4, State: keystate.Failed, Fingerprint: fp1, Expect: h.Expect()}))
			require.EqualValues(t, 5, b.read(t, "k").Version)
			require.False(t, b.apply(t, update{Key: "k", Version: 5, Deleted: true, Expect: h.Expect()}))
			require.EqualValues(t, 5, b.read(t, "k").Version)
		})

		t.Run("ExpectAbsent", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			h := b.header(t, "k")
			require.False(t, h.Found)
			require.Equal(t, cache.ExpectAbsent, h.Expect())
			b.apply(t, completed("k", 1, "raced"))
			require.False(t, b.apply(t, update{Key: "k", Version: 1, State: keystate.Failed, Fingerprint: fp1, Expect: h.Expect()}))
			require.True(t, b.apply(t, update{Key: "new", Version: 1, State: keystate.Failed, Fingerprint: fp1, Expect: cache.ExpectAbsent}))
		})

		t.Run("NeverClobbersALiveProvisionalClaim", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			_, err := b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "live"}, fp1, ownerA, time.Minute)
			require.NoError(t, err)
			h := b.header(t, "live")
			require.True(t, h.Provisional)
			require.False(t, b.apply(t, update{Key: "live", Deleted: true, Expect: h.Expect()}))
			require.True(t, b.read(t, "live").Provisional)

			const lease = 300 * time.Millisecond
			_, err = b.cache.Check(b.ctx, keystate.Ref{Scope: "s", Key: "dead"}, fp1, ownerA, lease)
			require.NoError(t, err)
			h = b.header(t, "dead")
			// The claim's PX is its lease, so give it a longer TTL to see the
			// expired-lease branch rather than the key vanishing.
			extended, err := b.rdb.PExpire(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "dead"}), time.Minute).Result()
			require.NoError(t, err)
			require.True(t, extended, "the claim outlived its lease before the test could extend it")
			oncetest.AwaitCacheLeaseOver(t, b.ctx, b.cache, keystate.Ref{Scope: "s", Key: "dead"})
			require.True(t, b.apply(t, update{Key: "dead", Deleted: true, Expect: h.Expect()}), "an expired provisional claim is an orphan")
		})

		t.Run("CorruptAndForeignValues", func(t *testing.T) {
			t.Parallel()
			b := setup(t, rdb)
			require.NoError(t, b.rdb.Set(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "junk"}), "not ours", 0).Err())
			require.NoError(t, b.rdb.HSet(b.ctx, b.cache.Key(keystate.Ref{Scope: "s", Key: "hash"}), "state", "completed").Err())
			for _, key := range []string{"junk", "hash"} {
				h := b.header(t, key)
				require.True(t, h.Found && h.Corrupt, key)
				require.True(t, b.apply(t, update{Key: key, Version: 2, State: keystate.Failed, Fingerprint: fp1, Expect: h.Expect()}))
				require.EqualValues(t, 2, b.read(t, key).Version)
			}
		})
	})
}
