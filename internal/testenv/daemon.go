package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Daemon is a command of this project run as a process for a test: on a
// free loopback address of its own, logging as text to Logs, killed when
// the test ends.
type Daemon struct {
	Addr string
	Cmd  *exec.Cmd
	Logs *LogBuffer
}

// StartDaemon starts bin with env (on top of the test process's
// environment, HTTP_ADDR and LOG_FORMAT=text) and waits until its /readyz
// answers 200.
func StartDaemon(tb testing.TB, bin string, env ...string) *Daemon {
	tb.Helper()
	d := &Daemon{Addr: FreeAddr(tb), Cmd: exec.CommandContext(tb.Context(), bin), Logs: &LogBuffer{}}
	d.Cmd.Env = append(os.Environ(), append(env, "HTTP_ADDR="+d.Addr, "LOG_FORMAT=text")...)
	d.Cmd.Stderr = d.Logs
	if err := d.Cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	tb.Cleanup(func() {
		_ = d.Cmd.Process.Kill()
		_ = d.Cmd.Wait()
	})
	WaitReady(tb, d.Addr)
	return d
}

// LogBuffer is a buffer a process's output goroutine writes while the test
// reads it.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
