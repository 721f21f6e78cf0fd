package browsertest

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/console"
	"github.com/onceonly/onceonly/oncetest"
)

const (
	user     = "ops"
	password = "browser-pass"
	// scriptBody is a stored response that would mark the page if it ran.
	scriptBody = `<script>window.pwned = true; document.title = "pwned"</script><p>receipt</p>`
)

type testBundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	rdb     *redis.Client
	prefix  string
	engine  *onceonly.Engine
	baseURL string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t)}
	b.rdb, b.prefix = oncetest.Redis(t)
	var err error
	b.engine, err = onceonly.New(onceonly.Config{Pool: b.pool, Redis: b.rdb, RedisPrefix: b.prefix, Logger: oncetest.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)
	c, err := console.New(console.Config{
		Engine: b.engine, Pool: b.pool, Auth: user + ":" + password,
		SampleInterval: 50 * time.Millisecond, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(c.Stop)
	srv := httptest.NewServer(c) // a port the OS chose
	t.Cleanup(srv.Close)
	b.baseURL = srv.URL + console.DefaultPrefix
	return b
}

// newBrowser starts Debian's headless Chromium for the test, sending the
// console's credentials with every request.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("no Chromium for the browser test: apt-get install chromium (scripts/test.sh installs it when missing)")
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tgt, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tgt, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": auth},
		})
		return err
	})))
	return ctx
}

// step bounds one browser action, so a page that never comes fails the
// test instead of hanging it.
func step(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// artifacts returns the folder the screenshots go to: TEST_ARTIFACTS_DIR,
// or artifacts/ beside this file (git-ignored).
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TEST_ARTIFACTS_DIR")
	if dir == "" {
		dir = "artifacts"
	}
	require.NoError(t, os.MkdirAll(dir, 0o750)) //nolint:gosec // G703: the test's own artifacts folder, named by whoever runs it
	return dir
}

// screenshot saves the whole page as name.png under artifacts.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(step(t, ctx), chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(artifacts(t), name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o600))
	t.Logf("screenshot: %s", path)
}

// TestConsoleInABrowser opens the overview and a key page as an operator
// would, reads the key's state and version off the page, checks a stored
// script body shows as text and never runs, and purges the key through the
// form and its confirmation.
func TestConsoleInABrowser(t *testing.T) {
	b := setup(t)
	// Some traffic for the overview: a stored response holding markup, a
	// replay, a failure, a parked event, two reconcile passes.
	for i := range 3 {
		_, err := b.engine.Do(b.ctx, "acct_demo", "pay_"+strconv.Itoa(i), []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
			return onceonly.Result{Status: 201, ContentType: "text/html", Body: []byte(scriptBody)}, nil
		})
		require.NoError(t, err)
	}
	out, err := b.engine.Do(b.ctx, "acct_demo", "pay_0", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{}, errors.New("a replay runs no handler")
	})
	require.NoError(t, err)
	require.True(t, out.Replayed)
	_, err = b.engine.Do(b.ctx, "acct_demo", "declined", []byte("p"), func(context.Context, pgx.Tx) (onceonly.Result, error) {
		return onceonly.Result{}, errors.New("the gateway declined")
	})
	require.Error(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO outbox (scope, key, version, attempts, parked_at, last_error)
		VALUES ('acct_demo', 'pay_9', 3, 10, now(), 'OOM command not allowed when used memory > ''maxmemory''');
		INSERT INTO reconcile_passes (started_at, finished_at, result, report) VALUES
		(now() - interval '61 seconds', now() - interval '60 seconds', 'ok', '{"scanned":4,"in_sync":3,"missing":1,"repaired":1}'),
		(now() - interval '1 second', now(), 'ok', '{"scanned":4,"in_sync":4}')`)
	require.NoError(t, err)

	ctx := newBrowser(t)

	// The overview.
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Navigate(b.baseURL+"/"), chromedp.WaitVisible(chromedp.CSS("#relay"))))
	parked, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`[data-figure="parked"]`)))
	require.NoError(t, err)
	require.Equal(t, "1", parked)
	lastPass, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`[data-figure="last-pass"]`)))
	require.NoError(t, err)
	require.Contains(t, lastPass, "ok")
	bars, err := chromedp.Run(step(t, ctx), chromedp.Evaluate[int](`document.querySelectorAll("#requests svg rect").length`))
	require.NoError(t, err)
	require.Positive(t, bars, "the requests chart has bars")
	screenshot(t, ctx, "console-overview")

	// The key list, filtered.
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Navigate(b.baseURL+"/keys?scope=acct_demo"), chromedp.WaitVisible(chromedp.CSS("table.keys"))))
	screenshot(t, ctx, "console-keys")

	// One key: its state and version as Postgres holds them, in sync.
	var state string
	var version int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status, version FROM idempotency_keys WHERE scope = 'acct_demo' AND key = 'pay_1'`).Scan(&state, &version))
	keyURL := b.baseURL + "/keys/acct_demo/pay_1"
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Navigate(keyURL), chromedp.WaitVisible(chromedp.CSS("#sync"))))
	shownState, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`tr[data-field="state"] td.pg`)))
	require.NoError(t, err)
	require.Equal(t, state, shownState)
	shownVersion, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`tr[data-field="version"] td.pg`)))
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(version, 10), shownVersion)
	redisVersion, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`tr[data-field="version"] td.redis`)))
	require.NoError(t, err)
	require.Equal(t, shownVersion, redisVersion)
	sync, err := chromedp.Run(step(t, ctx), chromedp.AttributeValue(chromedp.CSS("#sync"), "data-sync"))
	require.NoError(t, err)
	require.Equal(t, "in_sync", sync.Value)

	// The stored body: behind its toggle, shown as text, never run.
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Click(chromedp.CSS("#response details.blob summary")),
		chromedp.WaitVisible(chromedp.CSS("#response details.blob pre"))))
	shownBody, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS("#response details.blob pre")))
	require.NoError(t, err)
	require.Equal(t, scriptBody, shownBody, "the markup shows as text")
	pwned, err := chromedp.Run(step(t, ctx), chromedp.Evaluate[bool](`window.pwned === true || document.title === "pwned" || document.querySelectorAll("script").length > 0`))
	require.NoError(t, err)
	require.False(t, pwned, "the stored script did not run, and no script is on the page")
	screenshot(t, ctx, "console-key")

	// Parked events.
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Navigate(b.baseURL+"/events"), chromedp.WaitVisible(chromedp.CSS("table"))))
	screenshot(t, ctx, "console-events")

	// Purge through the form: the link, the confirmation, the POST.
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.Navigate(keyURL), chromedp.WaitVisible(chromedp.CSS("#actions"))))
	_, err = chromedp.RunResponse(step(t, ctx), chromedp.Click(chromedp.CSS("#actions a.danger")))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(step(t, ctx), chromedp.WaitVisible(chromedp.CSS("form.confirm"))))
	screenshot(t, ctx, "console-purge")
	res, err := chromedp.RunResponse(step(t, ctx), chromedp.Click(chromedp.CSS("form.confirm button[type=submit]")))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), res.Status, "the list the purge leads to")
	notice, err := chromedp.Run(step(t, ctx), chromedp.Text(chromedp.CSS(`[data-notice="purged"]`)))
	require.NoError(t, err)
	require.Contains(t, notice, "pay_1")
	loc, err := chromedp.Run(step(t, ctx), chromedp.Location())
	require.NoError(t, err)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, "pay_1", u.Query().Get("purged"))

	var rows int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = 'acct_demo' AND key = 'pay_1'`).Scan(&rows))
	require.Zero(t, rows, "the row is gone")
	require.Zero(t, b.rdb.Exists(b.ctx, b.prefix+"acct_demo:pay_1").Val(), "the Redis value is gone")
}
