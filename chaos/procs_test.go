package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/onceonly/oncetest"
)

// buildCommands builds api, relay, reconciler, gateway and consumer
// (without -race: six of them share two cores with the servers) and returns
// their folder.
func buildCommands(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", dir+"/", "../cmd/api", "../cmd/relay", "../cmd/reconciler", "../cmd/gateway", "../cmd/consumer")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build the commands: %v\n%s", err, out)
	}
	return dir
}

// proc is one supervised daemon process.
type proc struct {
	name, bin, addr string
	env             []string
	logPath         string
	// ctx is the test's: a process still running when the test ends is
	// killed.
	ctx context.Context

	mu  sync.Mutex
	cmd *exec.Cmd
	// pausedFrom and pausedTo bound the last pause (pausedTo is zero while
	// it lasts).
	pausedFrom, pausedTo time.Time
}

func newProc(t *testing.T, name, bin, addr string, env ...string) *proc {
	return &proc{name: name, bin: bin, addr: addr, env: append(os.Environ(), append(env, "HTTP_ADDR="+addr, "LOG_FORMAT=text")...),
		logPath: filepath.Join(t.TempDir(), name+".log"), ctx: t.Context()}
}

// start starts the process and waits until its /healthz answers.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logs, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logs.Close()
	cmd := exec.CommandContext(p.ctx, p.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, logs, logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd = cmd
	var lastErr error
	if oncetest.Poll(20*time.Second, func() bool {
		res, err := p.get("/healthz")
		if err == nil {
			res.Body.Close()
		}
		lastErr = err
		return err == nil
	}) {
		return nil
	}
	return fmt.Errorf("%s did not come up: %w\n%s", p.name, lastErr, p.tail())
}

// get sends a GET for path to the process.
func (p *proc) get(path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(p.ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// pause stops the process (SIGSTOP) for d, as a long GC pause or a frozen
// VM would, then lets it go on.
func (p *proc) pause(d time.Duration) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	p.mu.Lock()
	p.pausedFrom, p.pausedTo = time.Now(), time.Time{}
	p.mu.Unlock()
	if cmd.Process.Signal(syscall.SIGSTOP) != nil {
		return
	}
	time.Sleep(d) // the pause's length, not a wait for an event
	_ = cmd.Process.Signal(syscall.SIGCONT)
	p.mu.Lock()
	p.pausedTo = time.Now()
	p.mu.Unlock()
}

// pausedAround reports whether an answer the process gave at was held up
// by a pause: the process was stopped then, or went on less than a second
// before. A request whose deadline passed while the process stood still
// gets a 503 the moment it goes on, as after any stall that long.
func (p *proc) pausedAround(at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.pausedFrom.IsZero() && at.After(p.pausedFrom) && (p.pausedTo.IsZero() || at.Before(p.pausedTo.Add(time.Second)))
}

// kill sends SIGKILL, as a crash would.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		p.cmd = nil
	}
}

// stop sends SIGTERM and returns an error unless the process exits 0
// within 10 s.
func (p *proc) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	cmd := p.cmd
	p.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s exited badly after SIGTERM: %w", p.name, err)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("%s did not exit within 10 s of SIGTERM", p.name)
	}
}

// tail returns the end of the process's log.
func (p *proc) tail() string {
	raw, _ := os.ReadFile(p.logPath)
	if len(raw) > 4000 {
		raw = raw[len(raw)-4000:]
	}
	return string(raw)
}

// lines returns the lines of the process's log that mention word (at most
// 20), for the keys a violation names.
func (p *proc) lines(word string) string {
	raw, _ := os.ReadFile(p.logPath)
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.Contains(line, word+" ") || strings.Contains(line, word+"\"") || strings.HasSuffix(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out[max(0, len(out)-20):], "\n")
}

// runOnce runs a command to completion and returns its stdout.
func runOnce(ctx context.Context, bin string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}
