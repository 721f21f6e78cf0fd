package citus

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// runCommand runs bin with args and env (on top of the test's environment)
// to completion and returns its stdout; a non-zero exit fails the test.
func runCommand(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), args, err, out.String(), errOut.String())
	}
	return out.String()
}
