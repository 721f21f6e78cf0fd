// Package citus runs onceonly on Citus (distributed PostgreSQL, DESIGN §5):
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
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/onceonly/onceonly/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv("TEST_CITUS_URL") == "" {
		fmt.Fprintf(os.Stderr, "TEST_CITUS_URL is not set: %s\n", testenv.HowToStartCitus)
		os.Exit(1)
	}
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string
	errBuild  error
)

// commands builds api, relay, reconciler, gateway, consumer and the tour
// (without -race: several of them share the machine with three Postgres
// servers) once per test binary and returns their folder.
func commands(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, errBuild = os.MkdirTemp("", "onceonly-citus-bin-")
		if errBuild != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "../cmd/api", "../cmd/relay", "../cmd/reconciler",
			"../cmd/gateway", "../cmd/consumer", "../examples/tour").CombinedOutput()
		if err != nil {
			errBuild = fmt.Errorf("build the commands: %w\n%s", err, out)
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return binDir
}

// migrateUp runs `api migrate up` on dbURL, as a user does.
func migrateUp(t *testing.T, bins, dbURL string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bins+"/api", "migrate", "up")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("api migrate up on Citus: %v\n%s", err, out)
	}
}
