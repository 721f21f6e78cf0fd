package shutdown_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/oncetest"
)

// TestMain fails the package's tests when a goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logs is a logger whose output the test reads.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// server returns a server on a free loopback address whose /slow requests
// wait for release, and signals each one on entered.
func server(t *testing.T) (srv *http.Server, entered chan struct{}, release chan struct{}) {
	t.Helper()
	entered, release = make(chan struct{}, 1), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "done")
	})
	mux.HandleFunc("GET /up", func(http.ResponseWriter, *http.Request) {})
	return &http.Server{Addr: oncetest.FreeAddr(t), Handler: mux, ReadHeaderTimeout: time.Second}, entered, release
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// listening tells whether something accepts connections on addr.
func listening(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func waitUp(t *testing.T, addr string) {
	t.Helper()
	oncetest.Eventually(t, 5*time.Second, addr+" listening", func() bool {
		_, _, err := get(t.Context(), "http://"+addr+"/up")
		return err == nil
	})
}

// TestServeFinishesRequestsUnderWay: when ctx ends, the request under way
// still gets its answer, and Serve returns nil once it has.
func TestServeFinishesRequestsUnderWay(t *testing.T) {
	srv, entered, release := server(t)
	var out logs
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- shutdown.Serve(ctx, srv, slog.New(slog.NewTextHandler(&out, nil)), 5*time.Second) }()
	waitUp(t, srv.Addr)

	type answer struct {
		code int
		body string
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		code, body, err := get(t.Context(), "http://"+srv.Addr+"/slow")
		answered <- answer{code, body, err}
	}()
	<-entered
	cancel()
	oncetest.Eventually(t, 5*time.Second, "the shutdown begun", func() bool { return !listening(t.Context(), srv.Addr) })
	close(release)
	a := <-answered
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.code)
	require.Equal(t, "done", a.body)
	require.NoError(t, <-served)
	require.Contains(t, out.String(), "shutting down")
}

// TestServeGraceRunsOut: a request that outlasts the grace makes Serve
// return an error.
func TestServeGraceRunsOut(t *testing.T) {
	srv, entered, release := server(t)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- shutdown.Serve(ctx, srv, oncetest.QuietLogger(), 50*time.Millisecond) }()
	waitUp(t, srv.Addr)
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		_, _, _ = get(t.Context(), "http://"+srv.Addr+"/slow")
	}()
	<-entered
	cancel()
	err := <-served
	require.ErrorContains(t, err, "shut down "+srv.Addr)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(release)
	<-answered
}

// TestServeCannotListen: an address in use is Serve's error, at once.
func TestServeCannotListen(t *testing.T) {
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	srv := &http.Server{Addr: l.Addr().String(), ReadHeaderTimeout: time.Second}
	err = shutdown.Serve(t.Context(), srv, oncetest.QuietLogger(), time.Second)
	require.ErrorContains(t, err, "serve "+l.Addr().String())
}

// TestRunBesideStopsBoth: when ctx ends, work returns and the server shuts
// down; RunBeside returns work's error.
func TestRunBesideStopsBoth(t *testing.T) {
	srv, _, _ := server(t)
	ctx, cancel := context.WithCancel(t.Context())
	workErr := errors.New("work's end")
	working := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- shutdown.RunBeside(ctx, srv, oncetest.QuietLogger(), func(ctx context.Context) error {
			close(working)
			<-ctx.Done()
			return workErr
		})
	}()
	<-working
	waitUp(t, srv.Addr)
	cancel()
	require.ErrorIs(t, <-done, workErr)
	require.False(t, listening(t.Context(), srv.Addr), "the server is shut")
}

// TestRunBesideServerFails: a server that cannot listen stops the work, and
// its error is returned.
func TestRunBesideServerFails(t *testing.T) {
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	srv := &http.Server{Addr: l.Addr().String(), ReadHeaderTimeout: time.Second}
	err = shutdown.RunBeside(t.Context(), srv, oncetest.QuietLogger(), func(ctx context.Context) error {
		<-ctx.Done() // stopped because the server failed
		return nil
	})
	require.ErrorContains(t, err, "serve "+l.Addr().String())
}

// TestRunBesideWorkEnds: work that returns on its own (a failure) shuts the
// server down and its error is returned.
func TestRunBesideWorkEnds(t *testing.T) {
	srv, _, _ := server(t)
	boom := errors.New("boom")
	err := shutdown.RunBeside(t.Context(), srv, oncetest.QuietLogger(), func(context.Context) error { return boom })
	require.ErrorIs(t, err, boom)
}
