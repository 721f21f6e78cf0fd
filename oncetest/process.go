package oncetest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BuildBinary builds the main package pkg (a path such as "./cmd/relay",
// relative to the test's directory, or ".") with -race into a temporary
// directory and returns the binary's path.
func BuildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	if pkg == "." {
		wd, _ := os.Getwd()
		bin = filepath.Join(tb.TempDir(), filepath.Base(wd))
	}
	build := exec.CommandContext(tb.Context(), "go", "build", "-race", "-o", bin, pkg)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		tb.Fatalf("build %s: %v", pkg, err)
	}
	return bin
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return "127.0.0.1:" + strconv.Itoa(freePort(tb))
}

// WaitReady waits until http://addr/readyz answers 200.
func WaitReady(tb testing.TB, addr string) {
	tb.Helper()
	Eventually(tb, 15*time.Second, addr+" ready", func() bool { return Ready(tb.Context(), addr) })
}

// Ready reports whether http://addr/readyz answers 200 now.
func Ready(ctx context.Context, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
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

// ConfigEnv lists the environment variables the commands read; RunMain
// clears the ones a test does not set.
var ConfigEnv = []string{
	"DATABASE_URL", "DATABASE_SESSION_URL", "REDIS_URL", "REDIS_CLUSTER_URL", "REDIS_SENTINEL_URL", "RELAY_REDIS_WAIT_REPLICAS", "RELAY_REDIS_WAIT_TIMEOUT", "REDIS_PREFIX", "REDIS_WRITE_LAYOUT1", "HTTP_ADDR", "LOG_LEVEL", "LOG_FORMAT",
	"API_KEYS", "LEASE_TIMEOUT", "COMPLETED_TTL", "FAILED_TTL", "GATEWAY_LATENCY", "SLOW_GATEWAY_DELAY",
	"RELAY_BATCH", "RELAY_POLL_INTERVAL", "RELAY_MAX_ATTEMPTS", "RECONCILE_SCHEDULE", "REAP_GRACE",
	"RECONCILE_TIMEOUT", "RECONCILE_PAGE_SIZE", "DEFER_NOTIFY", "GATEWAY_URL", "GATEWAY_TIMEOUT", "RESUME_INTERVAL",
	"GATEWAY_FAULTS", "GATEWAY_HANG", "CONSOLE_AUTH", "CONSOLE_READONLY", "CONSOLE_REDACT",
	"BROKER_URL", "CONSUMER_MAX_FAILURES", "CONSUMER_WORKERS",
}

// RunMain calls a command's run function with exactly env set among
// ConfigEnv and returns its exit code and output. Tests using it must not
// be parallel (they set the process environment).
func RunMain(tb testing.TB, run func(args []string, stdout, stderr io.Writer) int, env map[string]string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	for _, k := range ConfigEnv {
		tb.Setenv(k, "")
		os.Unsetenv(k)
	}
	for k, v := range env {
		tb.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// Rejection is bad input a command must refuse: run with Env and Args, it
// exits non-zero with one line on stderr that contains Want.
type Rejection struct {
	Env  map[string]string
	Args []string
	Want string
}

// RequireRejections runs the command's run function once per case, as a
// subtest named after Want, and checks each refusal (see
// RequireOneLineError).
func RequireRejections(t *testing.T, run func(args []string, stdout, stderr io.Writer) int, cases []Rejection) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Want, func(t *testing.T) {
			code, stdout, stderr := RunMain(t, run, tc.Env, tc.Args...)
			RequireOneLineError(t, code, stdout, stderr, tc.Want)
		})
	}
}

// RequireOneLineError checks a failed run: a non-zero code, nothing on
// stdout, and one line on stderr containing want.
func RequireOneLineError(tb testing.TB, code int, stdout, stderr, want string) {
	tb.Helper()
	if code == 0 {
		tb.Fatalf("exit code 0, want non-zero; stderr: %s", stderr)
	}
	if stdout != "" {
		tb.Fatalf("stdout should be empty, got %q", stdout)
	}
	if !strings.Contains(stderr, want) {
		tb.Fatalf("stderr %q does not contain %q", stderr, want)
	}
	if n := strings.Count(strings.TrimSpace(stderr), "\n") + 1; n != 1 {
		tb.Fatalf("want one line on stderr, got %d: %s", n, stderr)
	}
}

// RequireDocumented checks that the command's -h output appears, as is, in
// docs/configuration.md (found from the command's directory), so the
// reference cannot drift from the flags.
func RequireDocumented(tb testing.TB, run func(args []string, stdout, stderr io.Writer) int) {
	tb.Helper()
	code, _, help := RunMain(tb, run, nil, "-h")
	if code != 0 {
		tb.Fatalf("-h exited %d", code)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		tb.Fatalf("read the configuration reference: %v", err)
	}
	if !strings.Contains(string(doc), help) {
		tb.Fatalf("docs/configuration.md does not hold this -h output; regenerate the section:\n%s", help)
	}
}
