package reconcile

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// sameBucket returns n names that t puts in one bucket, none in names.
func sameBucket(t *tally, n int) []string {
	byBucket := map[uint64][]string{}
	for i := 0; ; i++ {
		name := fmt.Sprintf("idem:s:extra%d", i)
		b := t.bucket(name)
		byBucket[b] = append(byBucket[b], name)
		if len(byBucket[b]) == n {
			return byBucket[b]
		}
	}
}

func TestTally(t *testing.T) {
	t.Parallel()
	live := make([]string, 5000)
	for i := range live {
		live[i] = fmt.Sprintf("idem:s:k%d", i)
	}
	for _, tc := range []struct {
		name string
		// postgres and redis add to the two sides beyond the live names
		// both saw; want are the names that must be in dirty buckets.
		run func(tl *tally) (postgres, redis, want []string)
	}{
		{"in step", func(*tally) (_, _, _ []string) { return }},
		{"an orphan", func(*tally) (_, _, _ []string) {
			return nil, []string{"idem:s:ghost"}, []string{"idem:s:ghost"}
		}},
		{"a name SCAN returned twice", func(*tally) (_, _, _ []string) {
			return nil, []string{live[3]}, []string{live[3]}
		}},
		{"an orphan SCAN returned twice", func(*tally) (_, _, _ []string) {
			return nil, []string{"idem:s:ghost", "idem:s:ghost"}, []string{"idem:s:ghost"}
		}},
		{"an orphan beside a name only Postgres saw", func(tl *tally) (_, _, _ []string) {
			// A write racing the pass in the orphan's bucket does not hide it.
			names := sameBucket(tl, 2)
			return names[:1], names[1:], names[1:]
		}},
		{"a name SCAN missed, another seen twice", func(tl *tally) (_, _, _ []string) {
			names := sameBucket(tl, 2)
			return names, []string{names[1], names[1]}, names
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tl := newTally()
			postgres, redis, want := tc.run(tl)
			for i := range live {
				tl.add(tl.postgres, live[i])
				tl.add(tl.redis, live[len(live)-1-i]) // in another order
			}
			for _, name := range postgres {
				tl.add(tl.postgres, name)
			}
			for _, name := range redis {
				tl.add(tl.redis, name)
			}
			for _, name := range want {
				require.True(t, tl.dirty(name), name)
			}
			require.LessOrEqual(t, tl.dirtyBuckets(), len(want))
			if len(want) == 0 {
				require.Zero(t, tl.dirtyBuckets())
			}
		})
	}
}
