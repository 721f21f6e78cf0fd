package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextStaysInBoundsAndGrows(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	ceiling := b.Min
	for i := range 40 {
		d := b.Next()
		if d < b.Min || d > b.Max || d > ceiling {
			t.Fatalf("attempt %d: %s outside [%s, %s]", i, d, b.Min, min(ceiling, b.Max))
		}
		ceiling = min(ceiling*2, b.Max)
	}
	// Full jitter: after many failures the delays spread over the range.
	seen := map[bool]bool{}
	for range 200 {
		seen[b.Next() > b.Max/2] = true
	}
	if !seen[true] || !seen[false] {
		t.Fatal("delays do not spread over [Min, Max]")
	}
	b.Reset()
	if d := b.Next(); d != b.Min {
		t.Fatalf("after Reset the first delay is %s, want %s", d, b.Min)
	}
}

func TestSleepStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); err == nil {
		t.Fatal("Sleep on a canceled context returned nil")
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
}
