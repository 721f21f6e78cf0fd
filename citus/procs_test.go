package citus

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/onceonly/internal/testenv"
)

// daemon is one of the commands run as a process on an address of its own
// that survives a restart (the load keeps sending there).
type daemon struct {
	name, bin, addr string
	env             []string
	logs            *testenv.LogBuffer
	ctx             context.Context

	mu  sync.Mutex
	cmd *exec.Cmd
}

// startDaemon starts bin with env (on top of the test's environment,
// HTTP_ADDR and LOG_FORMAT=text) and waits until its /readyz answers 200;
// the process is killed when the test ends, and its log shown if the test
// failed.
func startDaemon(t *testing.T, name, bin string, env ...string) *daemon {
	t.Helper()
	d := &daemon{name: name, bin: bin, addr: testenv.FreeAddr(t), logs: &testenv.LogBuffer{}, ctx: t.Context()}
	d.env = append(os.Environ(), append(env, "HTTP_ADDR="+d.addr, "LOG_FORMAT=text")...)
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("--- %s log tail:\n%s", d.name, d.tail())
		}
	})
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	return d
}

// url returns the process's base URL.
func (d *daemon) url() string { return "http://" + d.addr }

// start starts the process (again) and waits until its /readyz answers 200.
func (d *daemon) start() error {
	d.mu.Lock()
	cmd := exec.CommandContext(d.ctx, d.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = d.env, d.logs, d.logs
	if err := cmd.Start(); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("start %s: %w", d.name, err)
	}
	d.cmd = cmd
	d.mu.Unlock()
	if testenv.Poll(30*time.Second, func() bool { return d.ready() }) {
		return nil
	}
	return fmt.Errorf("%s did not become ready within 30 s:\n%s", d.name, d.tail())
}

func (d *daemon) ready() bool {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodGet, d.url()+"/readyz", nil)
	if err != nil {
		return false
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// kill sends SIGKILL, as a crash would, and waits for the exit.
func (d *daemon) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		_ = d.cmd.Process.Kill()
		_ = d.cmd.Wait()
		d.cmd = nil
	}
}

// stop sends SIGTERM and returns an error unless the process exits 0
// within 10 s.
func (d *daemon) stop() error {
	d.mu.Lock()
	cmd := d.cmd
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s exited badly after SIGTERM: %w\n%s", d.name, err, d.tail())
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("%s did not exit within 10 s of SIGTERM", d.name)
	}
}

// tail returns the end of the process's log.
func (d *daemon) tail() string {
	s := d.logs.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

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
