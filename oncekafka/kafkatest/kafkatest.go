// Package kafkatest starts a stand-in Kafka broker for tests: franz-go's
// kfake in a process of its own (command oncekafka/internal/kfakeserver),
// so that a test can stop it, kill it and start it again on the same port
// and data directory, which keeps the records and the committed offsets.
// The tests of oncekafka and of the demo consumer (cmd/consumer) use it.
// Build builds the broker with the go command, so it is for tests, not
// production.
package kafkatest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Build builds the broker's binary into dir and returns its path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "kfakeserver")
	build := exec.CommandContext(context.Background(), "go", "build", "-o", bin, "github.com/onceonly/onceonly/oncekafka/internal/kfakeserver")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kfakeserver: %w\n%s", err, out)
	}
	return bin, nil
}

// Broker is a broker process. Set Bin (from Build) and, to keep its data
// across restarts, DataDir; then Start it.
type Broker struct {
	Bin     string
	DataDir string // "" in memory
	// Addr is the broker's host:port once started; a restart keeps it.
	Addr string

	port   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts the broker (on a free port the first time, on the same
// port afterwards) and returns once it serves.
func (b *Broker) Start() error {
	if b.cmd != nil {
		return errors.New("kafkatest: the broker is running")
	}
	port := b.port
	if port == "" {
		port = "0"
	}
	args := []string{"-port", port}
	if b.DataDir != "" {
		args = append(args, "-data-dir", b.DataDir)
	}
	cmd := exec.CommandContext(context.Background(), b.Bin, args...) // stopped by Stop or Kill
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kfakeserver: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("kfakeserver did not start: %w", err)
	}
	b.Addr = strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	b.port = b.Addr[strings.LastIndexByte(b.Addr, ':')+1:]
	b.cmd, b.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(b.exited) }()
	return nil
}

// Stop shuts the broker down cleanly (SIGTERM: it flushes its data
// directory) and waits for it to exit; it kills it after 10 s. Stopping a
// broker not running does nothing.
func (b *Broker) Stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
	b.cmd = nil
}

// Kill kills the broker (SIGKILL) and waits for it to exit.
func (b *Broker) Kill() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.exited
	b.cmd = nil
}
