package oncetest

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// FaultMode is what a FaultProxy does to the bytes between its clients and
// its target.
type FaultMode int

const (
	// Pass forwards bytes both ways as they come.
	Pass FaultMode = iota
	// Reset makes the target look down: every open connection is closed
	// with a TCP reset on both sides, and every new one is reset as soon as
	// it is accepted.
	Reset
	// Blackhole is a network partition: connections are accepted but
	// nothing is forwarded either way, and nothing is closed. What was sent
	// waits (as TCP would retransmit it) and flows on once the mode is Pass
	// or Latency again; Reset cuts it.
	Blackhole
	// Latency forwards each chunk after a delay (SetLatency).
	Latency
)

// String names the mode.
func (m FaultMode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Reset:
		return "reset"
	case Blackhole:
		return "blackhole"
	case Latency:
		return "latency"
	}
	return "unknown"
}

// FaultProxy is a TCP proxy on a loopback port in front of a real server
// (Postgres, Redis): the bytes flow to the server, and the test switches
// network faults on and off at run time (SetMode), as toxiproxy would. It
// is closed when the test ends.
type FaultProxy struct {
	// Addr is the proxy's host:port; point clients here.
	Addr string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed *sync.Cond // broadcast on every change of mode, and on close
	mode    FaultMode
	delay   time.Duration
	closed  bool
	links   map[*link]struct{}
}

// link is one proxied connection; upstream is nil until dialed.
type link struct{ client, upstream net.Conn }

// NewFaultProxy starts a proxy to target (host:port) in Pass mode.
func NewFaultProxy(tb testing.TB, target string) *FaultProxy {
	tb.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(tb.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("fault proxy: listen: %v", err)
	}
	p := &FaultProxy{Addr: ln.Addr().String(), target: target, ln: ln, links: map[*link]struct{}{}}
	p.changed = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

// NewFaultProxyFor starts a proxy to the server of rawURL (postgres://…,
// redis://…) and returns it with rawURL pointed at the proxy instead.
func NewFaultProxyFor(tb testing.TB, rawURL string) (*FaultProxy, string) {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		tb.Fatalf("fault proxy: %q has no host:port", redact(rawURL))
	}
	p := NewFaultProxy(tb, u.Host)
	u.Host = p.Addr
	return p, u.String()
}

// SetMode switches the proxy to mode; Reset cuts every open connection at
// once.
func (p *FaultProxy) SetMode(mode FaultMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	if mode == Reset {
		for l := range p.links {
			l.reset()
		}
	}
	p.changed.Broadcast()
}

// SetLatency switches the proxy to Latency mode: each chunk, either way,
// is forwarded d after it was read.
func (p *FaultProxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
	p.SetMode(Latency)
}

// Mode returns the current mode.
func (p *FaultProxy) Mode() FaultMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Conns returns how many client connections the proxy holds now.
func (p *FaultProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops accepting, closes every connection and waits until the
// proxy's goroutines are done.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for l := range p.links {
			l.close()
		}
		p.changed.Broadcast()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *FaultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// serve proxies one client connection: it waits out a blackhole, dials the
// target and pumps both ways until either side ends.
func (p *FaultProxy) serve(c net.Conn) {
	l := &link{client: c}
	p.mu.Lock()
	p.links[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.close()
	}()
	if !p.await(false) {
		rst(c)
		return
	}
	dialer := net.Dialer{Timeout: 5 * time.Second}
	up, err := dialer.DialContext(context.Background(), "tcp", p.target)
	if err != nil {
		rst(c)
		return
	}
	p.mu.Lock()
	l.upstream = up
	cut := p.closed || p.mode == Reset
	p.mu.Unlock()
	if cut {
		l.reset()
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pump(up, c); done <- struct{}{} }()
	go func() { p.pump(c, up); done <- struct{}{} }()
	<-done
	l.close() // the other direction ends with it
	<-done
}

// pump copies src to dst, chunk by chunk, each as the mode allows.
func (p *FaultProxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.await(true) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF, or the connection was cut
		}
	}
}

// await blocks while the proxy is a blackhole, then reports whether bytes
// may go on (false when closed or resetting); in Latency mode it sleeps the
// delay first when delayed is set.
func (p *FaultProxy) await(delayed bool) bool {
	p.mu.Lock()
	for p.mode == Blackhole && !p.closed {
		p.changed.Wait()
	}
	ok, d := !p.closed && p.mode != Reset, time.Duration(0)
	if p.mode == Latency && delayed {
		d = p.delay
	}
	p.mu.Unlock()
	if ok && d > 0 {
		time.Sleep(d)
	}
	return ok
}

// reset closes both sides of l with a TCP reset. Called with p.mu held.
func (l *link) reset() {
	rst(l.client)
	if l.upstream != nil {
		rst(l.upstream)
	}
}

// close closes both sides of l.
func (l *link) close() {
	_ = l.client.Close()
	if l.upstream != nil {
		_ = l.upstream.Close()
	}
}

// rst closes c with a TCP reset rather than a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
