package oncetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/cache"
)

// SentinelMaster is the master name the test Sentinels monitor (the
// master_name of their REDIS_SENTINEL_URL).
const SentinelMaster = "onceonly"

// SentinelGroup is a Redis primary, one replica and three Sentinels of the
// test's own, on loopback, without persistence, stopped when the test ends.
// The Sentinels' timers are short (a primary is down after 1s of silence),
// so a failover takes a few seconds, and a server that comes back empty is
// made a replica of the current primary within about two.
type SentinelGroup struct {
	tb testing.TB
	// Servers are the Redis servers: Servers[0] starts as the primary,
	// Servers[1] as its replica. Which is which after a failover, Master
	// says.
	Servers   []*RedisServer
	sentinels []*sentinelProcess
}

// sentinelProcess is one redis-sentinel.
type sentinelProcess struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (s *sentinelProcess) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// NewSentinelGroup starts the servers and the Sentinels and waits until the
// replica is in sync and every Sentinel knows the replica and the other two
// Sentinels (before that, a failover could not reach its quorum).
func NewSentinelGroup(tb testing.TB) *SentinelGroup {
	tb.Helper()
	g := &SentinelGroup{tb: tb}
	// A full resync (a server rejoining empty) starts at once, not after
	// the default five-second wait for more replicas.
	primary := newRedisServer(tb, freePort(tb), "--repl-diskless-sync-delay", "0")
	replica := newRedisServer(tb, freePort(tb), "--repl-diskless-sync-delay", "0",
		"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	g.Servers = []*RedisServer{primary, replica}
	for range 3 {
		g.sentinels = append(g.sentinels, g.startSentinel(primary.Port()))
	}
	g.WaitHealthy(20 * time.Second)
	return g
}

// sentinelBinary returns the command line that runs a Sentinel on conf.
func sentinelBinary(tb testing.TB, conf string) (string, []string) {
	if bin, err := exec.LookPath("redis-sentinel"); err == nil {
		return bin, []string{conf}
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("this test needs redis-sentinel (or redis-server): %v\n%s", err, howToStart)
	}
	return bin, []string{conf, "--sentinel"}
}

func (g *SentinelGroup) startSentinel(primaryPort int) *sentinelProcess {
	tb := g.tb
	tb.Helper()
	s := &sentinelProcess{port: freePort(tb), dir: tb.TempDir()}
	conf := filepath.Join(s.dir, "sentinel.conf")
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %[4]s 1000
sentinel failover-timeout %[4]s 4000
sentinel parallel-syncs %[4]s 1
`, s.port, s.dir, filepath.Join(s.dir, "sentinel.log"), SentinelMaster, primaryPort)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		tb.Fatalf("write sentinel.conf: %v", err)
	}
	bin, args := sentinelBinary(tb, conf)
	s.cmd = exec.CommandContext(tb.Context(), bin, args...)
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("start redis-sentinel: %v", err)
	}
	tb.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer sc.Close()
	Eventually(tb, 10*time.Second, "redis-sentinel on "+s.addr(), func() bool {
		return sc.Ping(tb.Context()).Err() == nil
	})
	// Faster than the defaults (INFO every 10s, hello every 2s): a server
	// that came back is seen, and made a replica, within about two seconds
	// (Sentinel waits four hello periods first). TILT (Sentinel standing
	// still after its timer stalled, as on a loaded test machine) lasts 1s,
	// not 30s.
	err := sc.Process(tb.Context(), redis.NewStatusCmd(tb.Context(), "sentinel", "debug",
		"info-period", 500, "publish-period", 250, "tilt-period", 1000))
	if err != nil {
		tb.Fatalf("SENTINEL DEBUG on %s: %v", s.addr(), err)
	}
	return s
}

// URL returns the group in go-redis's failover URL form, as
// REDIS_SENTINEL_URL takes it.
func (g *SentinelGroup) URL() string {
	var u strings.Builder
	fmt.Fprintf(&u, "redis://%s?master_name=%s", g.sentinels[0].addr(), SentinelMaster)
	for _, s := range g.sentinels[1:] {
		u.WriteString("&addr=" + s.addr())
	}
	return u.String()
}

// Client opens a failover client of the group, configured as the commands
// configure theirs for REDIS_SENTINEL_URL, that is closed when the test
// ends.
func (g *SentinelGroup) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	return SentinelClient(tb, g.URL())
}

// SentinelClient opens a failover client on url (REDIS_SENTINEL_URL form),
// configured as the commands configure theirs, that is closed when the test
// ends.
func SentinelClient(tb testing.TB, url string) *redis.Client {
	tb.Helper()
	opts, err := cache.SentinelClientOptions(url)
	if err != nil {
		tb.Fatalf("Redis Sentinel URL: %v", err)
	}
	rdb, ok := cache.NewClient(opts).(*redis.Client)
	if !ok {
		tb.Fatalf("%s is not a Redis Sentinel URL", redact(url))
	}
	tb.Cleanup(func() { _ = rdb.Close() })
	Eventually(tb, 10*time.Second, "the Sentinels' master answers", func() bool {
		return rdb.Ping(tb.Context()).Err() == nil
	})
	return rdb
}

// Master returns the server every Sentinel names as the master and that
// says it is one; an error when they disagree or it does not (a failover
// under way).
func (g *SentinelGroup) Master(ctx context.Context) (*RedisServer, error) {
	var addr string
	for _, s := range g.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
		got, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = sc.Close()
		if err != nil {
			return nil, fmt.Errorf("sentinel %s: %w", s.addr(), err)
		}
		a := strings.Join(got, ":")
		if addr != "" && a != addr {
			return nil, fmt.Errorf("the Sentinels disagree: %s, %s", addr, a)
		}
		addr = a
	}
	for _, srv := range g.Servers {
		if srv.Addr() != addr {
			continue
		}
		info, err := srv.info(ctx)
		if err != nil {
			return nil, err
		}
		if info["role"] != "master" {
			return nil, fmt.Errorf("%s is named master but is a %s", addr, info["role"])
		}
		return srv, nil
	}
	return nil, fmt.Errorf("the Sentinels name %s, none of the group's servers", addr)
}

// WaitFailover waits until the Sentinels have promoted a server other than
// old, and returns it.
func (g *SentinelGroup) WaitFailover(old *RedisServer, timeout time.Duration) *RedisServer {
	g.tb.Helper()
	var m *RedisServer
	Eventually(g.tb, timeout, "a Sentinel failover away from "+old.Addr(), func() bool {
		var err error
		m, err = g.Master(context.Background())
		return err == nil && m != old
	})
	return m
}

// Healthy returns nil when every Sentinel names the same master, which
// has every other server as a replica in sync, and every Sentinel knows
// the other two and sees those replicas up; else what is missing.
func (g *SentinelGroup) Healthy(ctx context.Context) error {
	m, err := g.Master(ctx)
	if err != nil {
		return err
	}
	info, err := m.info(ctx)
	if err != nil {
		return err
	}
	want := len(g.Servers) - 1
	online := 0
	for i := range want {
		if strings.Contains(info["slave"+strconv.Itoa(i)], "state=online") {
			online++
		}
	}
	if online != want {
		return fmt.Errorf("master %s has %d of %d replicas online", m.Addr(), online, want)
	}
	for _, s := range g.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
		peers, perr := sc.Sentinels(ctx, SentinelMaster).Result()
		replicas, rerr := sc.Replicas(ctx, SentinelMaster).Result()
		_ = sc.Close()
		if err := errors.Join(perr, rerr); err != nil {
			return fmt.Errorf("sentinel %s: %w", s.addr(), err)
		}
		up := 0
		for _, r := range replicas {
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				up++
			}
		}
		if len(peers) != len(g.sentinels)-1 || up != want {
			return fmt.Errorf("sentinel %s knows %d other Sentinels and sees %d of %d replicas up",
				s.addr(), len(peers), up, want)
		}
	}
	return nil
}

// WaitHealthy waits until Healthy holds.
func (g *SentinelGroup) WaitHealthy(timeout time.Duration) {
	g.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := g.Healthy(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			g.tb.Fatalf("Sentinel group not healthy after %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// info returns the server's INFO replication fields.
func (s *RedisServer) info(ctx context.Context) (map[string]string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer rdb.Close()
	raw, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("%s: INFO replication: %w", s.Addr(), err)
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(raw, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

// Freeze stops the server's process (SIGSTOP): it keeps its connections
// but answers nothing and takes no replication stream, as a server stalled
// by a slow disk or a paused VM; its replication falls behind.
func (s *RedisServer) Freeze() {
	s.tb.Helper()
	if stopSignal == nil {
		s.tb.Fatal("Freeze needs a Unix system (SIGSTOP)")
	}
	if err := s.cmd.Process.Signal(stopSignal); err != nil {
		s.tb.Fatalf("freeze redis-server on port %d: %v", s.port, err)
	}
}

// Thaw resumes a frozen server (SIGCONT).
func (s *RedisServer) Thaw() {
	s.tb.Helper()
	if contSignal == nil {
		s.tb.Fatal("Thaw needs a Unix system (SIGCONT)")
	}
	if err := s.cmd.Process.Signal(contSignal); err != nil {
		s.tb.Fatalf("thaw redis-server on port %d: %v", s.port, err)
	}
}

// SentinelURL returns the REDIS_SENTINEL_URL of the shared test Sentinel
// group, the one TEST_REDIS_SENTINEL_URL names (scripts/test.sh starts one),
// else of a group of the test's own.
func SentinelURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("TEST_REDIS_SENTINEL_URL"); u != "" {
		return u
	}
	return NewSentinelGroup(tb).URL()
}
