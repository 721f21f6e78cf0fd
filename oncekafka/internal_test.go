package oncekafka

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Whatever order records settle in, a partition's mark is the offset after
// its longest settled prefix, and only ever grows; offsets need not be
// contiguous (transaction markers, compaction).
func TestMarkCoversTheSettledPrefixOnly(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(nil, "g")
	require.NoError(t, err)
	for round := range 50 {
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		s := newSession(&Consumer{opts: Options{PartitionWindow: 1 << 20}, metrics: m})
		recs := make([]*kgo.Record, 0, 40)
		off := int64(10)
		for range 40 {
			off += 1 + int64(rng.IntN(3)) // gaps
			recs = append(recs, &kgo.Record{Topic: "t", Partition: 0, Offset: off, LeaderEpoch: 3})
		}
		s.take(recs)
		items := append([]*item(nil), s.queue...)
		settled := make([]bool, len(items))
		last := int64(-1)
		for _, i := range rng.Perm(len(items)) {
			s.settle(items[i])
			settled[i] = true
			p := s.parts[topicPartition{"t", 0}]
			want := int64(-1)
			for j := 0; j < len(items) && settled[j]; j++ {
				want = recs[j].Offset + 1
			}
			if want < 0 {
				require.False(t, p.marked, "nothing settled from the start: no mark")
				continue
			}
			require.Equal(t, kgo.EpochOffset{Epoch: 3, Offset: want}, p.mark)
			require.GreaterOrEqual(t, want, last)
			last = want
		}
		require.Empty(t, s.parts[topicPartition{"t", 0}].pending)
	}
}

// A revoked partition's records are dropped from the queue, its mark
// frozen; a settlement arriving afterwards changes nothing.
func TestRevokedPartitionIsFrozen(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(nil, "g")
	require.NoError(t, err)
	s := newSession(&Consumer{opts: Options{PartitionWindow: 100}, metrics: m})
	s.take([]*kgo.Record{{Topic: "t", Partition: 0, Offset: 0}, {Topic: "t", Partition: 0, Offset: 1}, {Topic: "t", Partition: 1, Offset: 0}})
	first, ok := s.next()
	require.True(t, ok)
	s.settle(first)
	gone := s.drop(map[string][]int32{"t": {0}})
	require.Len(t, gone, 1)
	require.Equal(t, int64(1), gone[0].mark.Offset)
	it, ok := s.next()
	require.True(t, ok)
	require.Equal(t, int32(1), it.rec.Partition, "the revoked partition's queued record is skipped")
	s.settle(&item{rec: &kgo.Record{Topic: "t", Partition: 0, Offset: 1}, p: gone[0]})
	require.Equal(t, int64(1), gone[0].mark.Offset, "frozen")
}
