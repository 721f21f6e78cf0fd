package chaos

import (
	"encoding/json"
	"maps"
	"os"
	"sync"
	"testing"
)

// summaryFile is what this test process wrote to CHAOS_SUMMARY so far: the
// first write replaces the file, later ones (TestChaos, then
// TestChaosConsumer) add their entries to it, so one run leaves one JSON
// object with every run's summary.
var summaryFile struct {
	sync.Mutex
	entries map[string]any
}

// writeSummary adds entries to the JSON object at CHAOS_SUMMARY (when
// set), by name, and logs them.
func writeSummary(t *testing.T, entries map[string]any) {
	t.Helper()
	out, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		t.Errorf("encode the summaries: %v", err)
		return
	}
	t.Logf("chaos summaries:\n%s", out)
	path := os.Getenv("CHAOS_SUMMARY")
	if path == "" {
		return
	}
	summaryFile.Lock()
	defer summaryFile.Unlock()
	if summaryFile.entries == nil {
		summaryFile.entries = map[string]any{}
	}
	maps.Copy(summaryFile.entries, entries)
	if out, err = json.MarshalIndent(summaryFile.entries, "", "  "); err != nil {
		t.Errorf("encode the summaries: %v", err)
		return
	}
	if err := os.WriteFile(path, out, 0o600); err != nil { //nolint:gosec // G703: CHAOS_SUMMARY is where its operator wants the summary
		t.Errorf("write summary: %v", err)
	}
}
