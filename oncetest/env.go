package oncetest

import (
	"os"
	"strconv"
	"testing"
)

// Env returns the environment variable name, and fails the test when it
// is not set, saying why the test needs it and how to set it.
func Env(tb testing.TB, name, why, how string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		tb.Fatalf("%s: %s is not set\n%s", why, name, how)
	}
	return v
}

// EnvInt returns the positive integer in the environment variable name
// (a benchmark's setting), or def when it is not set; any other value
// fails the test.
func EnvInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
