package oncetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Daemon is a command of this project run as a process for a test: on a
// free loopback address of its own, logging as text to Logs, killed when
// the test ends.
type Daemon struct {
	Addr string
	Cmd  *exec.Cmd
	Logs *LogBuffer

	ctx context.Context
	bin string
	env []string
}

// StartDaemon starts bin with env (on top of the test process's
// environment, HTTP_ADDR and LOG_FORMAT=text) and waits until its /readyz
// answers 200.
func StartDaemon(tb testing.TB, bin string, env ...string) *Daemon {
	tb.Helper()
	d := &Daemon{Addr: FreeAddr(tb), Logs: &LogBuffer{}, ctx: tb.Context(), bin: bin}
	d.env = append(os.Environ(), append(env, "HTTP_ADDR="+d.Addr, "LOG_FORMAT=text")...)
	if err := d.start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Kill)
	WaitReady(tb, d.Addr)
	return d
}

func (d *Daemon) start() error {
	d.Cmd = exec.CommandContext(d.ctx, d.bin)
	d.Cmd.Env, d.Cmd.Stderr = d.env, d.Logs
	if err := d.Cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", d.bin, err)
	}
	return nil
}

// Kill sends SIGKILL to the process, as a crash would, and waits for its
// exit.
func (d *Daemon) Kill() {
	_ = d.Cmd.Process.Kill()
	_ = d.Cmd.Wait()
}

// Restart starts the command again (after Kill, say) on the same address
// and environment, logging to the same Logs, and waits up to 30 s until its
// /readyz answers 200. It returns an error rather than failing the test:
// fault injectors call it off the test's goroutine.
func (d *Daemon) Restart() error {
	if err := d.start(); err != nil {
		return err
	}
	if Poll(30*time.Second, func() bool { return Ready(d.ctx, d.Addr) }) {
		return nil
	}
	return fmt.Errorf("%s did not become ready within 30 s of its restart", d.bin)
}

// Stop sends SIGTERM and returns an error unless the process exits 0
// within 10 s (it is killed then).
func (d *Daemon) Stop() error {
	_ = d.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.Cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s exited badly after SIGTERM: %w", d.bin, err)
		}
		return nil
	case <-time.After(10 * time.Second):
		d.Kill()
		return fmt.Errorf("%s did not exit within 10 s of SIGTERM", d.bin)
	}
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
