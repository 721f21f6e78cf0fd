package console

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/reconcile"
)

// exactCountLimit is the largest table (the planner's row estimate) whose
// keys the overview counts exactly; above it, it shows the statistics'
// estimate, marked as such.
const exactCountLimit = 200_000

// countCap bounds the rows the overview counts for the outbox backlog, and
// executionsCap for the executions in progress (each one a heap read):
// past it a count reads "cap+".
const (
	countCap      = 100_000
	executionsCap = 1_000
)

// The overview's list lengths.
const (
	oldestLeases = 10
	passesShown  = 30
)

// overview is what the overview page shows.
type overview struct {
	Requests   requestsView
	States     statesView
	Executions executionsView
	Backlog    backlogView
	Passes     passesView
}

// requestsView: the requests the engine answered per minute, by outcome.
type requestsView struct {
	Chart chart
	// Sampling is false before the first sample (the sampler not started).
	Sampling bool
	Outcomes []outcomeCount
	Minutes  int
}

type outcomeCount struct {
	Outcome string
	Count   string
}

// outcomeGroups sorts the outcomes of onceonly_requests_total into the
// chart's series, in stacking order.
var outcomeGroups = []struct {
	series
	outcomes []string
}{
	{series{"executed", "s-executed"}, []string{"executed"}},
	{series{"replayed", "s-replayed"}, []string{"replayed_cache", "replayed_db"}},
	{series{"in flight (409)", "s-inflight"}, []string{"in_flight"}},
	{series{"refused (400/422)", "s-refused"}, []string{"reused", "invalid"}},
	{series{"failed", "s-failed"}, []string{"failed", "handler_error", "panic", "lease_lost"}},
	{series{"unavailable (503)", "s-unavailable"}, []string{"unavailable"}},
}

// requestsOf charts the last minutes of r.
func requestsOf(r *rates, now time.Time) requestsView {
	minutes := r.window(now, rateWindow)
	ss := make([]series, len(outcomeGroups))
	for i, g := range outcomeGroups {
		ss[i] = g.series
	}
	totals := map[string]float64{}
	cols := make([]column, len(minutes))
	for i, m := range minutes {
		values := make([]float64, len(outcomeGroups))
		for j, g := range outcomeGroups {
			for _, o := range g.outcomes {
				values[j] += m.counts[o]
			}
		}
		for o, n := range m.counts {
			totals[o] += n
		}
		label := m.start.UTC().Format("15:04")
		cols[i] = column{label: label, title: label + " UTC", values: values}
	}
	v := requestsView{
		Chart:    barChart("Requests per minute by outcome, last "+strconv.Itoa(len(minutes))+" minutes", wideChartWidth, ss, cols),
		Sampling: r.sampled(),
		Minutes:  len(minutes),
	}
	for o, n := range totals {
		v.Outcomes = append(v.Outcomes, outcomeCount{Outcome: o, Count: count(int64(n))})
	}
	slices.SortFunc(v.Outcomes, func(a, b outcomeCount) int { return cmp.Compare(a.Outcome, b.Outcome) })
	return v
}

// statesView: keys by state.
type statesView struct {
	Rows []stateRow
	// Estimated is true when the counts are the planner's estimates
	// (EstimateAge old), which count expired rows among the live.
	Estimated   bool
	EstimateAge string
	Chart       chart
}

type stateRow struct {
	State            string
	Live, Expired    string
	live, expiredRaw int64
}

// keyStates are the states, in the order the overview lists them.
var keyStates = []string{string(onceonly.StatusInProgress), string(onceonly.StatusCompleted), string(onceonly.StatusFailed)}

// passFailed is the result of a reconcile pass that failed.
const passFailed = "failed"

// readStates counts the keys by state: exactly for a small table, else
// from the planner's statistics.
func readStates(ctx context.Context, rd reader) (statesView, error) {
	var v statesView
	var size int64
	if err := rd.queryRow(ctx, tableSizeSQL, nil).Scan(&size); err != nil {
		return v, fmt.Errorf("read the table size: %w", err)
	}
	counts := map[string]*stateRow{}
	for _, s := range keyStates {
		counts[s] = &stateRow{State: s}
	}
	if size > exactCountLimit {
		rows, err := rd.query(ctx, keysByStateEstimateSQL, nil)
		if err != nil {
			return v, fmt.Errorf("estimate keys by state: %w", err)
		}
		for rows.Next() {
			var state string
			var n, ageMs int64
			if err := rows.Scan(&state, &n, &ageMs); err != nil {
				rows.Close()
				return v, fmt.Errorf("estimate keys by state: %w", err)
			}
			if r, ok := counts[state]; ok {
				r.live, v.Estimated, v.EstimateAge = n, true, span(ageMs)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return v, fmt.Errorf("estimate keys by state: %w", err)
		}
	}
	if !v.Estimated { // a small table, or one never analyzed
		rows, err := rd.query(ctx, keysByStateSQL, nil)
		if err != nil {
			return v, fmt.Errorf("count keys by state: %w", err)
		}
		for rows.Next() {
			var state string
			var live, expired int64
			if err := rows.Scan(&state, &live, &expired); err != nil {
				rows.Close()
				return v, fmt.Errorf("count keys by state: %w", err)
			}
			if r, ok := counts[state]; ok {
				r.live, r.expiredRaw = live, expired
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return v, fmt.Errorf("count keys by state: %w", err)
		}
	}
	ss := make([]series, len(keyStates))
	values := make([]float64, len(keyStates))
	for i, s := range keyStates {
		r := counts[s]
		r.Live, r.Expired = count(r.live), count(r.expiredRaw)
		v.Rows = append(v.Rows, *r)
		ss[i] = series{name: s, class: "k-" + s}
		values[i] = float64(r.live)
	}
	v.Chart = stackBar("Keys by state", ss, values)
	return v, nil
}

// executionsView: keys in progress.
type executionsView struct {
	InProgress, AwaitingResumption, AwaitingReap string
	// LongestOver is how long the oldest lease has been over ("" when none
	// is).
	LongestOver string
	// Stuck colours the executions awaiting resumption by how long the
	// oldest one's lease has been over (Thresholds.Stuck*): "", "warn" or
	// "alert"; StuckFor says how long.
	Stuck, StuckFor string
	Oldest          []leaseRow
}

type leaseRow struct {
	Scope, Key, Handler, URL string
	Version                  int64
	Lease, Age               string
	Over, Stepped            bool
	// Level colours a stuck execution (a step started, the lease over).
	Level string
}

// capped formats a count of at most limit rows.
func capped(n, limit int64) string {
	if n >= limit {
		return count(limit) + "+"
	}
	return count(n)
}

func readExecutions(ctx context.Context, rd reader, th Thresholds) (executionsView, error) {
	var v executionsView
	var held, resumable, reapable, overMs, stuckMs int64
	if err := rd.queryRow(ctx, executionsSQL, pgx.NamedArgs{"cap": executionsCap}).Scan(&held, &resumable, &reapable, &overMs, &stuckMs); err != nil {
		return v, fmt.Errorf("count executions: %w", err)
	}
	v.InProgress = capped(held, executionsCap)
	v.AwaitingResumption, v.AwaitingReap = capped(resumable, executionsCap), capped(reapable, executionsCap)
	if overMs > 0 {
		v.LongestOver = span(overMs)
	}
	if resumable > 0 {
		v.Stuck, v.StuckFor = stuckLevel(stuckMs, th), span(stuckMs)
	}
	rows, err := rd.query(ctx, oldestLeasesSQL, pgx.NamedArgs{paramLimit: oldestLeases})
	if err != nil {
		return v, fmt.Errorf("read the oldest leases: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r leaseRow
		var leaseMs, ageMs int64
		if err := rows.Scan(&r.Scope, &r.Key, &r.Version, &leaseMs, &ageMs, &r.Handler, &r.Stepped); err != nil {
			return v, fmt.Errorf("read the oldest leases: %w", err)
		}
		r.Lease, r.Age, r.Over = relative(leaseMs), span(ageMs), leaseMs <= 0
		if r.Over && r.Stepped {
			r.Level = stuckLevel(-leaseMs, th)
		}
		v.Oldest = append(v.Oldest, r)
	}
	if err := rows.Err(); err != nil {
		return v, fmt.Errorf("read the oldest leases: %w", err)
	}
	return v, nil
}

// stuckLevel colours an execution whose lease has been over for overMs,
// a step started.
func stuckLevel(overMs int64, th Thresholds) string {
	return level(time.Duration(overMs)*time.Millisecond, th.StuckWarn, th.StuckAlert)
}

// backlogView: the relay's backlog.
type backlogView struct {
	Pending, Parked             string
	OldestPending, OldestParked string
	HasParked                   bool
	// Summary says the backlog in a line: "N waiting, oldest Ns"; Level
	// colours it by the oldest waiting event's age (Thresholds.Pending*).
	Summary, Level string
}

func readBacklog(ctx context.Context, rd reader, th Thresholds) (backlogView, error) {
	var pending, parked, pendingMs, parkedMs int64
	if err := rd.queryRow(ctx, outboxBacklogSQL, pgx.NamedArgs{"cap": countCap}).Scan(&pending, &parked, &pendingMs, &parkedMs); err != nil {
		return backlogView{}, fmt.Errorf("read the outbox backlog: %w", err)
	}
	v := backlogView{Pending: capped(pending, countCap), Parked: capped(parked, countCap), HasParked: parked > 0}
	v.Summary = "none waiting"
	if pending > 0 {
		v.OldestPending = span(pendingMs)
		v.Summary = v.Pending + " waiting, oldest " + v.OldestPending
		v.Level = level(time.Duration(pendingMs)*time.Millisecond, th.PendingWarn, th.PendingAlert)
	}
	if parked > 0 {
		v.OldestParked = span(parkedMs)
	}
	return v, nil
}

// passesView: the reconciler's last passes.
type passesView struct {
	Last  *passRow
	Chart chart
	Count int
}

type passRow struct {
	Result, Error, Ago, Took string
	// Report is the pass's report, as `reconciler --once` prints it.
	Report reconcile.Report
	Drift  int64
}

// driftSeries are the kinds of drift, as a pass's report counts them.
var driftSeries = []series{
	{"missing", "d-missing"}, {"stale", "d-stale"}, {"wrong state", "d-wrong"},
	{"corrupt", "d-corrupt"}, {"orphaned", "d-orphaned"},
}

// driftOf returns a report's drift by kind, in driftSeries's order.
func driftOf(r reconcile.Report) []float64 {
	return []float64{float64(r.Missing), float64(r.Stale), float64(r.WrongState), float64(r.Corrupt), float64(r.Orphaned)}
}

func readPasses(ctx context.Context, rd reader) (passesView, error) {
	var v passesView
	rows, err := rd.query(ctx, reconcilePassesSQL, pgx.NamedArgs{paramLimit: passesShown})
	if err != nil {
		return v, fmt.Errorf("read the reconcile passes: %w", err)
	}
	defer rows.Close()
	var passes []passRow
	for rows.Next() {
		var p passRow
		var id, agoMs, tookMs int64
		var report string
		if err := rows.Scan(&id, &p.Result, &report, &p.Error, &agoMs, &tookMs); err != nil {
			return v, fmt.Errorf("read the reconcile passes: %w", err)
		}
		if err := json.Unmarshal([]byte(report), &p.Report); err != nil {
			return v, fmt.Errorf("read reconcile pass %d: %w", id, err)
		}
		p.Ago, p.Took = span(agoMs), span(tookMs)
		p.Drift = p.Report.Drift()
		passes = append(passes, p)
	}
	if err := rows.Err(); err != nil {
		return v, fmt.Errorf("read the reconcile passes: %w", err)
	}
	v.Count = len(passes)
	if len(passes) > 0 {
		v.Last = &passes[0]
	}
	cols := make([]column, len(passes))
	for i, p := range passes { // newest first: the chart runs oldest first
		c := &cols[len(passes)-1-i]
		c.title = p.Ago + " ago, " + p.Result
		c.label = "-" + p.Ago
		if p.Result == passFailed {
			// What it found before it failed, as the table shows for the
			// last pass: the legend counts it too.
			c.mark, c.title = true, c.title+": "+p.Error
		}
		c.values = driftOf(p.Report)
	}
	v.Chart = barChart("Drift found by the last reconcile passes", chartWidth, driftSeries, cols)
	return v, nil
}

// serveOverview serves the overview: requests by outcome, keys by state,
// executions in progress, the relay's backlog, the last reconcile passes.
func (c *Console) serveOverview(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	c.rates.sample(now) // the current minute up to date
	v := overview{Requests: requestsOf(c.rates, now)}
	err := c.read(r.Context(), func(ctx context.Context, rd reader) error {
		var err error
		if v.States, err = readStates(ctx, rd); err != nil {
			return err
		}
		if v.Executions, err = readExecutions(ctx, rd, c.cfg.Thresholds); err != nil {
			return err
		}
		if v.Backlog, err = readBacklog(ctx, rd, c.cfg.Thresholds); err != nil {
			return err
		}
		v.Passes, err = readPasses(ctx, rd)
		return err
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	for i := range v.Executions.Oldest {
		l := &v.Executions.Oldest[i]
		l.URL = c.keyURL(l.Scope, l.Key)
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", v)
}
