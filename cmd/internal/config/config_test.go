package config

import (
	"io"
	"testing"
)

// TestCountAndIsSet: a Count takes 0 and refuses a negative number, and
// IsSet tells a setting given (as a flag or through its environment
// variable, even to its default) from one left alone.
func TestCountAndIsSet(t *testing.T) {
	t.Setenv("ONCEONLY_TEST_ENV_COUNT", "0")
	s := NewSet("test", io.Discard)
	fromEnv := s.Count("from-env", "ONCEONLY_TEST_ENV_COUNT", 3, "")
	fromFlag := s.Count("from-flag", "ONCEONLY_TEST_FLAG_COUNT", 3, "")
	unset := s.Count("unset", "ONCEONLY_TEST_UNSET_COUNT", 3, "")
	if err := s.Parse([]string{"-from-flag", "3"}); err != nil {
		t.Fatal(err)
	}
	if *fromEnv != 0 || *fromFlag != 3 || *unset != 3 {
		t.Fatalf("values %d %d %d, want 0 3 3", *fromEnv, *fromFlag, *unset)
	}
	for name, want := range map[string]bool{"from-env": true, "from-flag": true, "unset": false} {
		if got := s.IsSet(name); got != want {
			t.Errorf("IsSet(%q) = %v, want %v", name, got, want)
		}
	}

	t.Setenv("ONCEONLY_TEST_ENV_COUNT", "-1")
	s = NewSet("test", io.Discard)
	s.Count("from-env", "ONCEONLY_TEST_ENV_COUNT", 3, "")
	if err := s.Parse(nil); err == nil || err.Error() != `bad configuration: ONCEONLY_TEST_ENV_COUNT="-1": must be a non-negative integer` {
		t.Fatalf("a negative count: %v", err)
	}
}
