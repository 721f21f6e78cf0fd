package main

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestConsoleIsServedOnlyWithItsCredentials: the console answers under
// /console/ when CONSOLE_AUTH is set (401 without its credentials), every
// /console/ path answers 404 when it is not, with or without credentials,
// and CONSOLE_READONLY refuses every POST.
func TestConsoleIsServedOnlyWithItsCredentials(t *testing.T) {
	t.Parallel() // waits on processes and leases more than it computes
	bin := binary(t, ".")
	dbURL := oncetest.DatabaseURL(t)
	start := func(env ...string) string {
		addr := oncetest.FreeAddr(t)
		cmd := exec.CommandContext(t.Context(), bin)
		cmd.Env = append(os.Environ(), append(env, "DATABASE_URL="+dbURL, "REDIS_URL="+oncetest.RedisURL(t),
			"REDIS_PREFIX=console"+oncetest.RandomSuffix(6)+":", "HTTP_ADDR="+addr, "LOG_LEVEL=error")...)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		oncetest.WaitReady(t, addr)
		return "http://" + addr
	}
	send := func(method, rawURL string, creds bool, form url.Values) (int, http.Header, string) {
		req, err := http.NewRequestWithContext(t.Context(), method, rawURL, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if creds {
			req.SetBasicAuth("ops", "pa55:word")
		}
		res, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, res.Header, string(body)
	}
	paths := []string{"/console/", "/console", "/console/keys?state=failed", "/console/keys/acct_demo/k1", "/console/events", "/console/nothing"}

	off := start()
	for _, path := range paths {
		for _, creds := range []bool{false, true} {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				code, _, _ := send(method, off+path, creds, nil)
				require.Equal(t, http.StatusNotFound, code, "%s %s, credentials %v", method, path, creds)
			}
		}
	}

	on := start("CONSOLE_AUTH=ops:pa55:word")
	for _, path := range paths {
		code, header, _ := send(http.MethodGet, on+path, false, nil)
		require.Equal(t, http.StatusUnauthorized, code, path)
		require.Contains(t, header.Get("WWW-Authenticate"), "Basic")
	}
	code, _, page := send(http.MethodGet, on+"/console/", true, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "Relay backlog")
	code, _, _ = send(http.MethodGet, on+"/console/events", true, nil)
	require.Equal(t, http.StatusOK, code)
	code, _, _ = send(http.MethodPost, on+"/console/events/unpark", true, url.Values{"ids": {"1"}})
	require.Equal(t, http.StatusForbidden, code, "no CSRF token")

	// A key to look at: a payment through the api.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, on+"/v1/payments",
		strings.NewReader(`{"amount":5,"currency":"eur","customer":"c","source":"tok_visa"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	code, _, page = send(http.MethodGet, on+"/console/keys/acct_demo/k1", true, nil)
	require.Equal(t, http.StatusOK, code)
	require.Regexp(t, `data-sync="(in_sync|missing)"`, page)
	code, _, page = send(http.MethodGet, on+"/console/keys/acct_demo/k1/purge", true, nil)
	require.Equal(t, http.StatusOK, code)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, m)
	token := m[1]

	// Read-only: the same credentials (so its tokens are accepted), yet
	// every POST is refused, and no page shows a form that changes anything.
	ro := start("CONSOLE_AUTH=ops:pa55:word", "CONSOLE_READONLY=1", "CONSOLE_REDACT=true")
	for _, path := range []string{"/console/", "/console/keys/acct_demo/k1"} {
		code, _, page = send(http.MethodGet, ro+path, true, nil)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "read-only")
		require.Contains(t, page, "redacted")
		require.NotContains(t, page, `method="post"`)
		require.NotContains(t, page, "succeeded", "no stored body")
	}
	code, _, _ = send(http.MethodPost, ro+"/console/keys/acct_demo/k1/purge", true, url.Values{"confirm": {"yes"}, "csrf": {token}})
	require.Equal(t, http.StatusForbidden, code)
	code, _, _ = send(http.MethodPost, on+"/console/keys/acct_demo/k1/purge", true, url.Values{"confirm": {"yes"}, "csrf": {token}})
	require.Equal(t, http.StatusSeeOther, code, "the token works where actions are allowed")

	// CONSOLE_ADDR: the console on a listener of its own (loopback), none
	// on the API's address.
	consoleAddr := oncetest.FreeAddr(t)
	apart := start("CONSOLE_AUTH=ops:pa55:word", "CONSOLE_ADDR="+consoleAddr)
	oncetest.Eventually(t, 10*time.Second, "the console listening on CONSOLE_ADDR", func() bool {
		status, _, _ := send(http.MethodGet, "http://"+consoleAddr+"/console/", false, nil)
		return status == http.StatusUnauthorized
	})
	code, _, page = send(http.MethodGet, "http://"+consoleAddr+"/console/", true, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "Relay backlog")
	for _, creds := range []bool{false, true} {
		code, _, _ = send(http.MethodGet, apart+"/console/", creds, nil)
		require.Equal(t, http.StatusNotFound, code, "no console on the API's address, credentials %v", creds)
	}
	code, _, _ = send(http.MethodGet, "http://"+consoleAddr+"/v1/payments", true, nil)
	require.Equal(t, http.StatusNotFound, code, "no API on the console's address")
}
