package reconcile

import (
	"hash/maphash"
	"sync/atomic"
)

// tallyBuckets is how many hash buckets a tally sorts Redis key names into:
// 2 × 512 KB of sums, whatever the number of keys.
const tallyBuckets = 1 << 16

// A tally finds the Redis keys that may have no live Postgres row without
// looking every Redis key up in Postgres.
//
// The Postgres scan adds the name of every live key whose Redis value it
// found; the SCAN of Redis adds every name it returns. Each side sums a
// seeded 64-bit hash of its names per bucket (sums modulo 2^64). A name seen
// as often by both sides adds the same to both sums; an orphan (a Redis name
// with no live row, seen at least once by SCAN and never by the Postgres
// scan) adds its hash to one side only, and so does a name SCAN returned
// twice. A bucket whose two sums differ is dirty, and only its names are
// looked up in Postgres. A dirty bucket can also come from a write racing
// the pass (a name one side saw and the other did not); looking its names up
// costs time, never correctness. An orphan goes unnoticed only if the other
// differences in its bucket cancel its hash exactly, a 2^-64 chance against
// hashes seeded at random for every pass, so names chosen by clients cannot
// aim at it.
type tally struct {
	bucketSeed, sumSeed maphash.Seed
	redis, postgres     []uint64
}

func newTally() *tally {
	return &tally{
		bucketSeed: maphash.MakeSeed(), sumSeed: maphash.MakeSeed(),
		redis: make([]uint64, tallyBuckets), postgres: make([]uint64, tallyBuckets),
	}
}

func (t *tally) bucket(name string) uint64 {
	return maphash.String(t.bucketSeed, name) % tallyBuckets
}

// add adds name to sums, one side's per-bucket sums: t.redis for a name
// SCAN returned, t.postgres for the name of a live key whose Redis value was
// found. Safe for concurrent use.
func (t *tally) add(sums []uint64, name string) {
	atomic.AddUint64(&sums[t.bucket(name)], maphash.String(t.sumSeed, name))
}

// dirty reports whether name's bucket sums differ. Call it only once both
// scans are over (it reads the sums without synchronization).
func (t *tally) dirty(name string) bool {
	b := t.bucket(name)
	return t.redis[b] != t.postgres[b]
}

// dirtyBuckets counts the buckets whose sums differ.
func (t *tally) dirtyBuckets() int {
	n := 0
	for b := range t.redis {
		if t.redis[b] != t.postgres[b] {
			n++
		}
	}
	return n
}
