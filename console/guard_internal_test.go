package console

import (
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	g, err := newGuard("ops:secret", nil, nil)
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	token := g.token("ops", now)
	require.True(t, g.validToken(token, "ops", now))
	require.True(t, g.validToken(token, "ops", now.Add(tokenLife)))
	require.False(t, g.validToken(token, "ops", now.Add(tokenLife+time.Second)), "expired")
	require.False(t, g.validToken(token, "other", now), "another user's")
	require.False(t, g.validToken("", "ops", now))
	require.False(t, g.validToken(token[1:], "ops", now))

	same, err := newGuard("ops:secret", nil, nil)
	require.NoError(t, err)
	require.True(t, same.validToken(token, "ops", now), "a process with the same credentials accepts it")
	other, err := newGuard("ops:another", nil, nil)
	require.NoError(t, err)
	require.False(t, other.validToken(token, "ops", now), "other credentials sign otherwise")
}

func TestRates(t *testing.T) {
	t.Parallel()
	counts := map[string]float64{"executed": 5}
	r := newRates(func() map[string]float64 {
		return maps.Clone(counts)
	}, 5)
	t0 := time.Date(2026, 1, 2, 3, 4, 10, 0, time.UTC)
	require.False(t, r.sampled())
	r.sample(t0) // the baseline: the 5 before it count nowhere
	require.True(t, r.sampled())
	counts["executed"], counts["in_flight"] = 7, 1
	r.sample(t0.Add(20 * time.Second))
	counts["executed"] = 10
	r.sample(t0.Add(70 * time.Second)) // the next minute
	w := r.window(t0.Add(70*time.Second), 3)
	require.Len(t, w, 3)
	require.Empty(t, w[0].counts)
	require.Equal(t, map[string]float64{"executed": 2, "in_flight": 1}, w[1].counts)
	require.Equal(t, map[string]float64{"executed": 3}, w[2].counts)
	// Five minutes on, the ring has forgotten them.
	w = r.window(t0.Add(6*time.Minute), 5)
	for _, m := range w {
		require.Empty(t, m.counts)
	}
}

func TestFormats(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1,234,567", count(1234567))
	require.Equal(t, "-1,000", count(-1000))
	require.Equal(t, "999", count(999))
	require.Equal(t, "850ms", span(850))
	require.Equal(t, "3m12s", span(192_000))
	require.Equal(t, "5h04m", span((5*60+4)*60_000))
	require.Equal(t, "3d01h", span((73)*3_600_000))
	require.Equal(t, "in 42s", relative(42_000))
	require.Equal(t, "42s ago", relative(-42_000))
	require.Equal(t, "8.0 KiB", byteSize(8192))
	require.Equal(t, float64(50), niceCeil(41))
	require.Equal(t, float64(1), niceCeil(0))
}
