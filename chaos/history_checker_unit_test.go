package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestHistoryChecker feeds the checker made-up histories, one per kind of
// violation and a few that break nothing (a failed run then a takeover, a
// killed run, a paused one, a canceled run that noticed late), and checks
// what it finds and what it puts it down to. It needs no server.
func TestHistoryChecker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := func(id, mode string, from, to int, result string) histRun {
		r := histRun{ID: id, Attempt: "a" + id, Worker: "p0", Scope: "s", Key: "k", Mode: mode, Payload: "p1", Start: at(from), Result: result}
		if to >= 0 {
			r.End = at(to)
		}
		return r
	}
	call := func(id, entry string, from, to int, told, runID string) histCall {
		return histCall{Attempt: "a" + id, Worker: "p0", Scope: "s", Key: "k", Entry: entry, Payload: "p1", Start: at(from), End: at(to), Told: told, RunID: runID}
	}
	completed := func(runID string) (map[string]histKey, map[string][]string) {
		return map[string]histKey{"s/k": {Status: "completed", RunID: runID}}, map[string][]string{"s/k": {runID}}
	}
	withPayload := func(r histRun, p string) histRun { r.Payload = p; return r }
	withWorker := func(r histRun, w string) histRun { r.Worker = w; return r }
	claimed := func(r histRun, version int64) histRun { r.Version = version; return r }

	type want struct{ kind, bug string }
	cases := []struct {
		name string
		h    history
		want []want
	}{{
		name: "a failed run, a retry that commits, a replay: nothing",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs:  []histRun{run("r1", entryDo1, 0, 10, "failed"), run("r2", entryDo1+rowSuffix, 20, 30, "ok")},
				Calls: []histCall{call("r1", entryDo1, 0, 12, toldFailed, ""), call("r2", entryDo1, 19, 32, toldOK, "r2"), call("x", entryHTTP, 40, 41, toldReplayed, "r2")},
				Keys:  keys, Effects: effects,
			}
		}(),
	}, {
		name: "a two-phase run beside a one-commit run: I4, bug3",
		h: func() history {
			keys, effects := completed("r2")
			return history{Runs: []histRun{run("r1", entryDo1, 0, 50, "failed"), run("r2", entryDo2, 10, 20, "ok")}, Keys: keys, Effects: effects}
		}(),
		want: []want{{vOverlap, bug3}},
	}, {
		name: "two lock holders at once (a probe that missed a promotion's claim): I4, bug1",
		h: history{
			Runs: []histRun{run("r1", entryRunStep, 0, 50, "failed"), run("r2", entryRun, 10, 20, "failed")},
			Keys: map[string]histKey{"s/k": {Status: "failed"}},
		},
		want: []want{{vOverlap, bug1}},
	}, {
		name: "a one-commit run after a committed one-commit run: I13, bug1",
		h: func() history {
			keys, effects := completed("r1")
			return history{
				Runs:  []histRun{run("r1", entryDo1, 0, 10, "ok"), run("r2", entryRun, 20, 30, "ok")},
				Calls: []histCall{call("r1", entryDo1, 0, 12, toldOK, "r1"), call("r2", entryRun, 19, 32, toldLost, "")},
				Keys:  keys, Effects: effects,
			}
		}(),
		want: []want{{vAfterCommit, bug1}},
	}, {
		// The resumption of claim v3 was entered within its lease; the
		// record of its start waited (a starved machine) past the lease,
		// the resumer claimed v4, ran and committed; v3's run found its
		// lease lost and stopped before acting. By recorded ends it runs
		// beside v4's run (the rule before: I4), by the record of its
		// start after v4's commit (I13).
		name: "a resumption that found its lease lost before acting, beside a later claim's commit: nothing",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs: []histRun{claimed(run("r1", modeResume, 0, 1700, "lost"), 3), claimed(run("r2", modeResume, 1600, 1610, "ok"), 4)},
				Keys: keys, Effects: effects,
			}
		}(),
	}, {
		// The same resumption entered after v4's commit (its batch held it
		// up past its lease): it started on a claim taken over, though it
		// did nothing; a lost lease excuses no late start.
		name: "a resumption started on a claim older than a committed later claim's: told once, by claim order: bug6",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs: []histRun{claimed(run("r1", modeResume, 1700, 1701, "lost"), 3), claimed(run("r2", modeResume, 1600, 1610, "ok"), 4)},
				Keys: keys, Effects: effects,
			}
		}(),
		want: []want{{vStaleStart, bug6}},
	}, {
		name: "a two-phase run started on a claim a failed later claim had taken over: I4 by claim order, bug6",
		h: history{
			Runs: []histRun{claimed(run("r1", entryDo2, 1620, 1630, "failed"), 3), claimed(run("r2", entryDoSQL, 1600, 1610, "failed"), 4)},
			Keys: map[string]histKey{"s/k": {Status: "failed"}},
		},
		want: []want{{vStaleStart, bug6}},
	}, {
		name: "a lost run after a commit, its process stalled before it started: nothing",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs:   []histRun{claimed(run("r1", modeResume, 1700, 1701, "lost"), 3), claimed(run("r2", modeResume, 1600, 1610, "ok"), 4)},
				Pauses: []histPause{{Worker: "p0", From: at(200), To: at(1690)}},
				Keys:   keys, Effects: effects,
			}
		}(),
	}, {
		// Its process paused (its transaction ended by Postgres, no row
		// left) before it found its lease lost: another payload may run.
		name: "another payload after a lost one-commit run whose process paused: nothing",
		h: history{
			Runs: []histRun{withWorker(run("r1", entryConsumer, 0, 2600, "lost"), "w1.1"),
				withPayload(withWorker(run("r2", entryConsumer, 2300, 2320, "failed"), "w1.1"), "p2")},
			Pauses: []histPause{{Worker: "w1.1", From: at(50), To: at(2250)}},
			Keys:   map[string]histKey{"s/k": {Status: "failed"}},
		},
	}, {
		name: "another payload after a lost one-commit run: bug5",
		h: history{
			Runs: []histRun{run("r1", entryConsumer, 0, 2600, "lost"), withPayload(run("r2", entryConsumer, 2300, 2320, "failed"), "p2")},
			Keys: map[string]histKey{"s/k": {Status: "failed"}},
		},
		want: []want{{vOtherPayload, bug5}},
	}, {
		name: "a lost one-commit run after a commit: I13, bug1",
		h: func() history {
			keys, effects := completed("r1")
			return history{
				Runs:  []histRun{run("r1", entryDo1, 0, 10, "ok"), run("r2", entryRun, 20, 21, "lost")},
				Calls: []histCall{call("r1", entryDo1, 0, 12, toldOK, "r1"), call("r2", entryRun, 19, 32, toldReplayed, "r1")},
				Keys:  keys, Effects: effects,
			}
		}(),
		want: []want{{vAfterCommit, bug1}},
	}, {
		name: "a one-commit retry refused right after a failed one-commit run: bug2",
		h: func() history {
			keys, effects := completed("r3")
			return history{
				Runs: []histRun{run("r1", entryConsumer, 0, 10, "failed"), run("r2", entryDo1, 12, 20, "ok"), run("r3", entryDo1+rowSuffix, 30, 40, "ok")},
				Calls: []histCall{call("r1", entryConsumer, 0, 11, toldFailed, ""), call("r2", entryDo1, 11, 22, toldLost, ""),
					call("r3", entryDo1, 29, 41, toldOK, "r3")},
				Keys: keys, Effects: effects,
			}
		}(),
		want: []want{{vLostNoTakeover, bug2}},
	}, {
		name: "a one-commit overrun told lost, then another payload runs: bug5 twice",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs:  []histRun{run("r1", entryRun, 0, 1510, "canceled"), withPayload(run("r2", entryDo1, 2000, 2010, "ok"), "p2")},
				Calls: []histCall{call("r1", entryRun, 0, 1520, toldLost, "")},
				Keys:  keys, Effects: effects,
			}
		}(),
		want: []want{{vLostNoTakeover, bug5}, {vOtherPayload, bug5}},
	}, {
		// Its step promoted it (a row from then on): when its lease ran
		// out, a resumption took it over, after the lease, and committed.
		name: "a promoted run-step that overran, told lost, resumed after its lease: nothing",
		h: func() history {
			keys, effects := completed("r2")
			r1 := run("r1", entryRunStep, 0, 2050, "ok")
			r1.EndVersion = 2
			return history{
				Runs:  []histRun{r1, claimed(run("r2", modeResume, 2650, 2840, "ok"), 3)},
				Calls: []histCall{call("r1", entryRunStep, 0, 3880, toldLost, "")},
				Keys:  keys, Effects: effects,
			}
		}(),
	}, {
		name: "another payload after a failed two-phase run",
		h: history{
			Runs: []histRun{run("r1", entryDo2, 0, 10, "failed"), withPayload(run("r2", entryDoSQL, 20, 30, "failed"), "p2")},
			Keys: map[string]histKey{"s/k": {Status: "failed"}},
		},
		want: []want{{vOtherPayload, bugOther}},
	}, {
		name: "another payload after a one-commit run whose commit a two-phase claim refused: bug3 only",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs:  []histRun{run("r1", entryDo1, 0, 10, "ok"), withPayload(run("r2", entryDo2, 11, 30, "ok"), "p2")},
				Calls: []histCall{call("r1", entryDo1, 0, 12, toldLost, ""), call("r2", entryDo2, 8, 31, toldOK, "r2")},
				Keys:  keys, Effects: effects,
			}
		}(),
		want: []want{{vHeldCommit, bug3}},
	}, {
		name: "another payload after a failed DoTx: nothing (its failure leaves no row)",
		h: history{
			Runs: []histRun{run("r1", entryDoTx, 0, 10, "failed"), withPayload(run("r2", entryDoTx, 20, 30, "failed"), "p2")},
		},
	}, {
		name: "a committed run's caller told lost, another told a result that did not commit",
		h: func() history {
			keys, effects := completed("r1")
			return history{
				Runs:  []histRun{run("r1", entryDo2, 0, 10, "ok")},
				Calls: []histCall{call("r1", entryDo2, 0, 12, toldLost, ""), call("x", entryDo1, 20, 21, toldReplayed, "r9")},
				Keys:  keys, Effects: effects,
			}
		}(),
		want: []want{{vCommittedTold, bugLostAfterCommit}, {vLostNoTakeover, bugOther}, {vWrongResult, bugOther}},
	}, {
		name: "a key left in progress, two business rows on a completed key",
		h: history{
			Runs:    []histRun{run("r1", entryDo2, 0, 10, "ok"), run("r2", entryDo2, 20, 30, "ok")},
			Keys:    map[string]histKey{"s/k": {Status: "completed", RunID: "r1"}, "s/j": {Status: "in_progress"}},
			Effects: map[string][]string{"s/k": {"r1", "r2"}},
		},
		want: []want{{vEffects, bugOther}, {vUnsettled, bugOther}},
	}, {
		name: "a run of a killed process ends at the kill",
		h: history{
			Runs:  []histRun{withWorker(run("r1", entryDo2, 0, -1, ""), "w1.1"), run("r2", entryDo2, 50, 60, "failed"), run("r3", entryDo2, 200, 210, "failed")},
			Kills: map[string]time.Time{"w1.1": at(100)},
			Keys:  map[string]histKey{"s/k": {Status: "failed"}},
		},
		want: []want{{vOverlap, bugOther}},
	}, {
		name: "a run paused past its lease, taken over meanwhile: nothing",
		h: func() history {
			keys, effects := completed("r2")
			return history{
				Runs:   []histRun{withWorker(run("r1", entryDo2, 0, 3000, "canceled"), "w1.1"), run("r2", entryDo2, 1800, 1900, "ok")},
				Calls:  []histCall{{Attempt: "ar1", Worker: "w1.1", Scope: "s", Key: "k", Entry: entryDo2, Start: at(0), End: at(3001), Told: toldLost}},
				Pauses: []histPause{{Worker: "w1.1", From: at(100), To: at(2900)}},
				Keys:   keys, Effects: effects,
			}
		}(),
	}, {
		name: "a canceled run that noticed late: no overlap within the slack",
		h: history{
			Runs: []histRun{run("r1", entryDo2, 0, 1530, "canceled"), run("r2", entryDo2, 1500, 1510, "failed")},
			Keys: map[string]histKey{"s/k": {Status: "failed"}},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			h.Lease = 1500 * time.Millisecond
			var got []want
			for _, v := range check(&h) {
				got = append(got, want{v.Kind, v.Bug})
			}
			key := func(w want) string { return fmt.Sprint(w) }
			slices.SortFunc(got, func(a, b want) int { return strings.Compare(key(a), key(b)) })
			slices.SortFunc(tc.want, func(a, b want) int { return strings.Compare(key(a), key(b)) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v\nwant %v\n%s", got, tc.want, summarize(check(&h), 5).format(1))
			}
		})
	}
}
