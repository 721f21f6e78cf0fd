package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/onceonly/onceonly/oncetest"
)

// built holds the commands this package's tests run as processes, each
// built once per test binary: a -race link takes seconds, and most tests
// here run the api beside the gateway.
var built struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string // package path → binary
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cmd-api-test-binaries")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built.dir, built.bins = dir, map[string]string{}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// binary returns the -race binary of the main package pkg ("." or a
// sibling such as "../gateway"), building it on first use.
func binary(t *testing.T, pkg string) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if bin, ok := built.bins[pkg]; ok {
		return bin
	}
	bin := oncetest.BuildBinary(t, pkg)
	kept := filepath.Join(built.dir, fmt.Sprintf("%d-%s", len(built.bins), filepath.Base(bin)))
	if err := os.Rename(bin, kept); err != nil {
		t.Fatalf("keep the %s binary: %v", pkg, err)
	}
	built.bins[pkg] = kept
	return kept
}
