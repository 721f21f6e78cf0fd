package oncenats

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTermTakesReason(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]bool{
		"2.9.10":        false,
		"2.10.3":        false,
		"2.10.4":        true,
		"v2.10.22":      true,
		"2.11.0-beta.1": true,
		"3.0.0":         true,
		"1.4.1":         false,
		"":              false,
		"2.10":          false,
		"garbage":       false,
	} {
		require.Equal(t, want, termTakesReason(version), version)
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"payments.charge", "payments.charge", true},
		{"payments.charge", "payments.dead", false},
		{"payments.*", "payments.dead", true},
		{"payments.*", "payments.dead.x", false},
		{"payments.>", "payments.dead.x", true},
		{"payments.>", "payments", false},
		{">", "payments", true},
		{"*.charge", "payments.charge", true},
		{"payments.charge.x", "payments.charge", false},
	} {
		require.Equal(t, tc.want, subjectMatches(tc.pattern, tc.subject), "%s ~ %s", tc.pattern, tc.subject)
	}
}

func TestProgressInterval(t *testing.T) {
	t.Parallel()
	require.Equal(t, 10*time.Second, progressInterval(30*time.Second, 30*time.Second))
	require.Equal(t, time.Second, progressInterval(3*time.Second, 30*time.Second), "AckWait shorter than the lease")
	require.Equal(t, 2*time.Second, progressInterval(time.Minute, 6*time.Second), "the lease shorter than AckWait")
	require.Equal(t, 10*time.Second, progressInterval(0, time.Minute), "the server's default AckWait")
}
