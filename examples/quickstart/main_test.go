package main_test

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestQuickstart runs the Getting started program as a user would (go
// build, then the binary with DATABASE_URL, REDIS_URL, NATS_URL and
// HTTP_ADDR), on a nats-server of its own: the message it publishes twice
// to JetStream is consumed once and both copies are acked, the second as a
// replay; an order posted twice with one Idempotency-Key is written once
// and replayed; and the program stays short (under 70 lines of code).
func TestQuickstart(t *testing.T) {
	ctx := oncetest.Context(t)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	code := 0
	for line := range strings.Lines(string(src)) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "//") {
			code++
		}
	}
	require.Less(t, code, 70, "lines of code in main.go")

	dbURL := oncetest.EmptyDatabaseURL(t)
	addr := oncetest.FreeAddr(t)
	bin := oncetest.BuildBinary(t, ".")
	cmd := exec.CommandContext(ctx, bin)
	// The program uses the default Redis prefix: a logical database of its
	// own, emptied first, keeps earlier runs' keys away.
	redisURL := oncetest.RedisURL(t)
	redisURL = redisURL[:strings.LastIndex(redisURL, "/")] + "/7"
	flush := oncetest.RedisClient(t, redisURL)
	require.NoError(t, flush.FlushDB(ctx).Err())
	natsURL := oncetest.NewNATSServer(t).URL() // the program's stream has a fixed name
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "NATS_URL="+natsURL, "HTTP_ADDR="+addr)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	lines := bufio.NewScanner(stdout)
	for _, want := range []string{"message: ack replayed: false", "message: ack replayed: true"} {
		require.True(t, lines.Scan(), "the program printed its messages' settlements")
		require.Equal(t, want, lines.Text())
	}

	var replayed []string
	for range 2 {
		oncetest.Eventually(t, 10*time.Second, "POST /orders answered", func() bool {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", strings.NewReader(`{"sku":"book"}`))
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "order-1")
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			res.Body.Close()
			require.Equal(t, http.StatusCreated, res.StatusCode)
			replayed = append(replayed, res.Header.Get("Idempotent-Replayed"))
			return true
		})
	}
	require.Equal(t, []string{"", "true"}, replayed)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var orders int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 2, orders, "one order from the message, one from the request")
}

// TestGuideShowsThisProgram: docs/getting-started.md shows main.go as it
// is, so the guide's code is the code the test above runs.
func TestGuideShowsThisProgram(t *testing.T) {
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	guide, err := os.ReadFile("../../docs/getting-started.md")
	require.NoError(t, err)
	program := string(src[strings.Index(string(src), "import ("):])
	require.Contains(t, string(guide), program, "docs/getting-started.md shows examples/quickstart/main.go from its imports on")
	require.LessOrEqual(t, strings.Count(string(guide), "\n"), 150, "the guide stays short")
}

// TestReadmeShowsThisProgram: README.md's example is lines of main.go, in
// main.go's order, so the landing page cannot drift from the program the
// test above runs.
func TestReadmeShowsThisProgram(t *testing.T) {
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(readme), "```go\n")
	require.True(t, ok, "README.md has a Go example")
	block, _, _ = strings.Cut(block, "```")
	rest := string(src)
	for line := range strings.Lines(block) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		i := strings.Index(rest, "\t"+line)
		require.GreaterOrEqual(t, i, 0, "README.md's line %q is a line of main.go (one level less indented), after the one before it", line)
		rest = rest[i+len(line):]
	}
}
