package oncetest

import (
	"bufio"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer serves a line echo on a loopback port until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

type echoConn struct {
	net.Conn
	r *bufio.Reader
}

func dialEcho(t *testing.T, addr string) *echoConn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &echoConn{Conn: c, r: bufio.NewReader(c)}
}

func (c *echoConn) send(t *testing.T, line string) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
}

// recv reads one line within d; it returns the error of a read that failed.
func (c *echoConn) recv(d time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	line, err := c.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func TestFaultProxy(t *testing.T) {
	t.Parallel()
	p := NewFaultProxy(t, echoServer(t))
	c := dialEcho(t, p.Addr)
	want := func(c *echoConn, line string) {
		t.Helper()
		c.send(t, line)
		if got, err := c.recv(5 * time.Second); err != nil || got != line {
			t.Fatalf("echo of %q: got %q, %v", line, got, err)
		}
	}
	want(c, "pass")

	// A blackhole holds what was sent, on open and new connections alike,
	// and delivers it when it clears.
	p.SetMode(Blackhole)
	c.send(t, "held")
	fresh := dialEcho(t, p.Addr)
	fresh.send(t, "held too")
	for _, conn := range []*echoConn{c, fresh} {
		if got, err := conn.recv(200 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a blackhole let %q (%v) through", got, err)
		}
	}
	p.SetMode(Pass)
	for conn, line := range map[*echoConn]string{c: "held", fresh: "held too"} {
		if got, err := conn.recv(5 * time.Second); err != nil || got != line {
			t.Fatalf("after the blackhole: got %q, %v; want %q", got, err, line)
		}
	}

	// Reset cuts open connections and every new one.
	p.SetMode(Reset)
	if _, err := c.recv(5 * time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an open connection survived a reset: %v", err)
	}
	var d net.Dialer
	if rc, err := d.DialContext(t.Context(), "tcp", p.Addr); err == nil { // the reset may already meet the dial
		refused := &echoConn{Conn: rc, r: bufio.NewReader(rc)}
		t.Cleanup(func() { _ = rc.Close() })
		_, _ = refused.Write([]byte("refused\n")) // the write may land before the reset does, or meet it
		if _, err := refused.recv(5 * time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a new connection was served during a reset: %v", err)
		}
	}
	Eventually(t, 5*time.Second, "the reset connections are gone", func() bool { return p.Conns() == 0 })

	// Latency delays each chunk, either way.
	const delay = 100 * time.Millisecond
	p.SetLatency(delay)
	slow := dialEcho(t, p.Addr)
	start := time.Now()
	want(slow, "slow")
	if took := time.Since(start); took < 2*delay {
		t.Fatalf("a round trip took %s through a latency of %s each way", took, delay)
	}
	p.SetMode(Pass)
	want(slow, "pass again")
	if p.Mode() != Pass || p.Mode().String() != "pass" {
		t.Fatalf("mode %v", p.Mode())
	}
}
