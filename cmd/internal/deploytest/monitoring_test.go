package deploytest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/onceonly/onceonly/oncetest"
)

// The monitoring files, relative to the repository's root.
var (
	alertRules     = filepath.Join(root, "deploy", "prometheus", "alerts.yml")
	alertRuleTests = filepath.Join(root, "deploy", "prometheus", "alerts_test.yml")
	dashboard      = filepath.Join(root, "deploy", "grafana", "onceonly.json")
)

// promtool returns the path of promtool, failing the test with how to get
// it when it is missing.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: apt-get install --no-install-recommends prometheus (scripts/test.sh, through scripts/services.sh tools, installs it)")
	}
	return path
}

// TestAlertRules checks deploy/prometheus/alerts.yml with promtool and runs
// its unit tests (alerts_test.yml).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertRuleTests}} {
		out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}

	// Every alert has a unit test.
	raw, err := os.ReadFile(alertRuleTests)
	require.NoError(t, err)
	tested := map[string]bool{}
	for _, m := range regexp.MustCompile(`alertname: (\w+)`).FindAllStringSubmatch(string(raw), -1) {
		tested[m[1]] = true
	}
	for _, rule := range readAlertRules(t) {
		require.True(t, tested[rule.Alert], "%s has a test in alerts_test.yml", rule.Alert)
	}
}

type alertRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
}

func readAlertRules(t *testing.T) []alertRule {
	t.Helper()
	raw, err := os.ReadFile(alertRules)
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	var rules []alertRule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	require.NotEmpty(t, rules)
	return rules
}

// dashboardExprs returns every query expression of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				if s, ok := child.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				}
				walk(child)
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		}
	}
	walk(doc)
	require.NotEmpty(t, exprs)
	return exprs
}

// promqlWords are the PromQL functions, aggregations and keywords the
// dashboard and the rules use: every other name in an expression is a
// metric's.
var promqlWords = []string{
	"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "deriv", "delta",
	"histogram_quantile", "clamp_min", "time", "absent", "and", "or", "unless", "bool",
	"max_over_time", "min_over_time", "offset",
}

// metricNames returns the metric names an expression reads: its words,
// once grouping clauses, label matchers, ranges, strings and numbers are
// taken out, that are no PromQL word.
func metricNames(expr string) []string {
	for _, strip := range []*regexp.Regexp{
		regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
		regexp.MustCompile(`"[^"]*"`), regexp.MustCompile(`\{[^}]*\}`), regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b\d[\w.]*`),
	} {
		expr = strip.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, w := range regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`).FindAllString(expr, -1) {
		if !slices.Contains(promqlWords, w) && !slices.Contains(names, w) {
			names = append(names, w)
		}
	}
	return names
}

// TestDashboardAndAlertsNameExportedMetrics scrapes the /metrics of a
// running api, relay and reconciler, and checks that every metric the
// Grafana dashboard and the alert rules query is one of theirs.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	t.Parallel()
	dbURL := oncetest.DatabaseURL(t)
	_, prefix := oncetest.Redis(t)
	env := []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + oncetest.RedisURL(t), "REDIS_PREFIX=" + prefix, "LOG_LEVEL=error",
		"RECONCILE_SCHEDULE=@every 1s"}
	api := oncetest.StartDaemon(t, oncetest.BuildBinary(t, "../../api"), env...)
	relay := oncetest.StartDaemon(t, oncetest.BuildBinary(t, "../../relay"), env...)
	reconciler := oncetest.StartDaemon(t, oncetest.BuildBinary(t, "../../reconciler"), env...)

	// A payment, so the api's labelled series with no preset labels
	// (status codes, request durations) exist.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+api.Addr+"/v1/payments",
		strings.NewReader(`{"amount":5,"currency":"eur","customer":"c","source":"tok_visa"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", "monitoring-1")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)

	exported := map[string]bool{}
	for _, d := range []*oncetest.Daemon{api, relay, reconciler} {
		for name := range scrape(t, d.Addr) {
			exported[name] = true
		}
	}
	require.True(t, exported["onceonly_requests_total"], "the scrape holds the engine's metrics")

	check := func(where, expr string) {
		names := metricNames(expr)
		require.NotEmpty(t, names, "%s: %s reads no metric", where, expr)
		for _, name := range names {
			require.True(t, exported[name], "%s: %s reads %s, which no daemon exports", where, expr, name)
		}
	}
	for _, expr := range dashboardExprs(t) {
		check("deploy/grafana/onceonly.json", expr)
	}
	for _, rule := range readAlertRules(t) {
		check("deploy/prometheus/alerts.yml "+rule.Alert, rule.Expr)
	}
}

// scrape returns the metric names addr's /metrics exports: each family's,
// with the _bucket, _sum and _count series of histograms and summaries.
func scrape(t *testing.T, addr string) map[string]bool {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/metrics", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	names := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(res.Body, 8<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		names[f[2]] = true
		switch f[3] {
		case "histogram":
			names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
		case "summary":
			names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
		}
	}
	require.NoError(t, sc.Err())
	return names
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"onceonly_redis_fallback_total", "onceonly_requests_total"},
		metricNames(`sum(rate(onceonly_redis_fallback_total[5m])) / clamp_min(sum(rate(onceonly_requests_total{outcome="x"}[$__rate_interval])), 1e-9) > 0.01`))
	require.Equal(t, []string{"onceonly_relay_lag_seconds_bucket"},
		metricNames(`histogram_quantile(0.99, sum by (le) (rate(onceonly_relay_lag_seconds_bucket[5m])))`))
	require.Equal(t, []string{"onceonly_relay_pending_events"},
		metricNames(`max(onceonly_relay_pending_events) > 1000 and deriv(max(onceonly_relay_pending_events)[5m:30s]) > 0`))
}
