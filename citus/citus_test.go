// Package citus runs onceonly on Citus (distributed PostgreSQL, docs/citus.md):
// the commands as real processes with DATABASE_URL at the coordinator of
// the cluster TEST_CITUS_URL names. It checks that `api migrate up`
// distributes the tables, that the tour passes, that a short chaos run
// (api processes killed, Redis flushed, every payment sent several times)
// makes no duplicate payment and the outbox drains, and that `relay --once`
// and `reconciler --once` find everything in sync.
//
// Only `make test-citus` runs these tests (scripts/test-citus.sh; `make
// test` leaves this module out: CI has no Citus). Without TEST_CITUS_URL
// they fail and say how to build and start a cluster. Each test gets a
// database of its own on every node of the cluster, with the workers
// registered in it (Citus registers nodes per database).
package citus

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/onceonly/onceonly/oncetest"
)

func TestMain(m *testing.M) {
	if os.Getenv("TEST_CITUS_URL") == "" {
		fmt.Fprintf(os.Stderr, "TEST_CITUS_URL is not set: %s\n", oncetest.HowToStartCitus)
		os.Exit(1)
	}
	dir, err := buildCommands()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// bins is the folder of the commands TestMain built.
var bins string

// buildCommands builds api, relay, reconciler, gateway, consumer and the
// tour (without -race: several of them share the machine with three
// Postgres servers) into a new folder and returns it.
func buildCommands() (string, error) {
	dir, err := os.MkdirTemp("", "onceonly-citus-bin-")
	if err != nil {
		return "", fmt.Errorf("make the commands' folder: %w", err)
	}
	out, err := exec.CommandContext(context.Background(), "go", "build", "-o", dir+"/", "../cmd/api", "../cmd/relay",
		"../cmd/reconciler", "../cmd/gateway", "../cmd/consumer", "../demo/tour").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("build the commands: %w\n%s", err, out)
	}
	return dir, nil
}

// migrateUp runs `api migrate up` on dbURL, as a user does.
func migrateUp(t *testing.T, dbURL string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bins+"/api", "migrate", "up")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("api migrate up on Citus: %v\n%s", err, out)
	}
}
