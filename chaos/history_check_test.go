package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The history checker: what the recorded history of runs, business rows,
// calls and faults must satisfy, in the spirit of Jepsen's Elle. It is a
// pure function of the history (TestHistoryChecker feeds it made-up
// histories), so it judges a run of any length after the fact.

// histRun is one handler run, as history_runs holds it.
type histRun struct {
	ID, Attempt, Worker, Scope, Key, Mode, Payload string
	// Version is the version of the claim the run holds its key by (0: a
	// one-commit execution's lock, or a claim in the caller's transaction
	// that may roll back and be claimed again at the same version).
	Version int64
	// EndVersion is the claim's version when the run ended: above 0 for a
	// one-commit run whose step promoted it (it held a row from then on).
	EndVersion int64
	Start      time.Time // the handler was entered
	Recorded   time.Time // its start reached Postgres (zero in made-up histories)
	End        time.Time // zero: none recorded (its process died)
	// Result is ok, failed, canceled (its sleep stopped by its context),
	// panic, lost (it found its lease lost before its first action: it did
	// nothing), or "" without an end.
	Result string
}

// histCall is one call a caller made, as history_calls holds it.
type histCall struct {
	Attempt, Worker, Scope, Key, Entry, Payload string
	Start, End                                  time.Time
	Told, RunID, Detail                         string
}

// histKey is a key's row in idempotency_keys at the end: its status and
// the run its stored answer names.
type histKey struct {
	Status, RunID string
}

// histPause is a process stopped (SIGSTOP) from From to To, or one that
// noticed it stood still that long (a stall).
type histPause struct {
	Worker   string
	From, To time.Time
}

// history is everything the checker judges.
type history struct {
	Runs    []histRun
	Calls   []histCall
	Effects map[string][]string  // scope/key → the run ids of its business rows
	Keys    map[string]histKey   // scope/key → its row (absent: no row)
	Kills   map[string]time.Time // worker → when it was killed (SIGKILL)
	Pauses  []histPause
	Lease   time.Duration
}

// refOf names a key in the checker's maps and messages.
func refOf(scope, key string) string { return scope + "/" + key }

// The kinds of violation.
const (
	vOverlap        = "I4 overlapping runs"
	vAfterCommit    = "I13 run after a committed run"
	vStaleStart     = "I4 run started on a claim taken over"
	vHeldCommit     = "I4 claim during a one-commit's commit"
	vLostNoTakeover = "told lost/taken over, nothing took over"
	vOtherPayload   = "key accepted another payload"
	vCommittedTold  = "committed run's caller told otherwise"
	vWrongResult    = "caller told a result other than the committed one"
	vUnsettled      = "key left in progress"
	vEffects        = "business rows != one per completed key"
)

// The bugs a violation is put down to, from what its runs were: the known
// bugs of the engine at the time the checker was written (see
// TestChaosHistory), or other.
const (
	bug1     = "bug1 one-commit probe's snapshot predates its lock"
	bug2     = "bug2 failed row written after the lock was released"
	bug3     = "bug3 cross-mode runs beside a one-commit execution"
	bug5     = "bug5 one-commit overrun leaves no row"
	bugOther = "unattributed"
	// bug6: a handler started on a claim older than its lease, after a
	// later claim had taken the key over (the resumer wrote Redis for its
	// batch, one key after another, before it started the batch's
	// resumptions, and the engine started a handler without looking at its
	// lease; fixed since: a claim older than its lease never starts its
	// handler). A resumption after a committed resumption, in the history.
	bug6 = "bug6 handler started on a claim older than its lease"
	// bugLostAfterCommit: a committed run's caller told its lease was
	// lost (its writes rolled back): once the commit landed the key was no
	// longer in progress, so the lease keeper's next renewal gave the
	// lease up (or the lease ran out, no renewal extending it any more),
	// and the lease's end canceled the commit's answer on its way back
	// (fixed since: the completion goes with the caller's context).
	bugLostAfterCommit = "bug7 committed, but its caller told lost"
)

// violation is one breach of an invariant, with the bug it is put down to.
type violation struct {
	Kind, Bug, Text string
}

// canceledSlack is how long a handler that stops because the engine
// canceled its context (its lease ended) may take to notice: stopping is
// cooperative (docs/invariants.md, I4's limits), so a run that started
// within it after such a run's end is no overlap.
const canceledSlack = 50 * time.Millisecond

// checker holds what check derives from a history.
type checker struct {
	h          *history
	byKey      map[string][]*histRun // by start
	byAttempt  map[string]*histRun
	end        map[*histRun]time.Time // effective end
	paused     map[*histRun]bool      // stopped by a pause of its process
	committed  map[string]*histRun    // scope/key → the run whose business row exists
	calls      map[string]histCall    // by attempt
	stale      map[*histRun]*histRun  // a run → the later claim's run it started after (checkClaimOrder)
	violations []violation
}

// check returns every violation of h.
func check(h *history) []violation {
	c := &checker{h: h, byKey: map[string][]*histRun{}, byAttempt: map[string]*histRun{},
		end: map[*histRun]time.Time{}, paused: map[*histRun]bool{}, committed: map[string]*histRun{}, calls: map[string]histCall{},
		stale: map[*histRun]*histRun{}}
	for _, call := range h.Calls {
		c.calls[call.Attempt] = call
	}
	for i := range h.Runs {
		r := &h.Runs[i]
		ref := refOf(r.Scope, r.Key)
		c.byKey[ref] = append(c.byKey[ref], r)
		if r.Attempt != "" {
			c.byAttempt[r.Attempt] = r
		}
		c.end[r] = c.effectiveEnd(r)
	}
	for _, runs := range c.byKey {
		slices.SortFunc(runs, func(a, b *histRun) int { return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.ID, b.ID)) })
	}
	c.checkEffects()
	for _, ref := range slices.Sorted(maps.Keys(c.byKey)) {
		c.checkClaimOrder(ref)
		c.checkOverlaps(ref)
		c.checkAfterCommit(ref)
		c.checkPayloads(ref)
	}
	c.checkCalls()
	return c.violations
}

// effectiveEnd is when r stopped acting on its key: its recorded end; for
// a run of a killed process, the kill (or its lease's end, whichever is
// first); for a run whose process was paused while it ran, the pause (its
// lease ended during the pause, and what it does after is fenced); for a
// run that found its lease lost before its first action, its start (it
// did nothing; its start's record may have waited past the lease).
func (c *checker) effectiveEnd(r *histRun) time.Time {
	end := r.End
	if end.IsZero() {
		end = r.Start.Add(c.h.Lease)
		if kill, ok := c.h.Kills[r.Worker]; ok && kill.After(r.Start) && kill.Before(end) {
			end = kill
		}
	}
	for _, p := range c.h.Pauses {
		if p.Worker == r.Worker && p.From.After(r.Start) && p.From.Before(end) {
			end, c.paused[r] = p.From, true
		}
	}
	if r.Result == "lost" {
		return r.Start // paused or not before it found out
	}
	return end
}

func (c *checker) addf(kind, bug, format string, args ...any) {
	c.violations = append(c.violations, violation{Kind: kind, Bug: bug, Text: fmt.Sprintf(format, args...)})
}

// describe names a run for a violation's text.
func (c *checker) describe(r *histRun) string {
	end, result := "no end", r.Result
	if !r.End.IsZero() {
		end = r.End.Format("15:04:05.000")
	}
	if result == "" {
		result = "killed"
	}
	claim := ""
	if r.Version > 0 {
		claim = fmt.Sprintf(" v%d", r.Version)
	}
	return fmt.Sprintf("%s [%s%s %s %s–%s %s]", r.ID, r.Mode, claim, r.Payload, r.Start.Format("15:04:05.000"), end, result)
}

func oneCommit(r *histRun) bool { return oneCommitModes[r.Mode] }

// lockHeld reports whether r held its key by a one-commit transaction's
// lock to its end: a run of a one-commit mode that no step promoted to a
// row (a promoted one is taken over, and told so, as a two-phase one is).
func lockHeld(r *histRun) bool { return oneCommit(r) && r.EndVersion == 0 }

// rowClaimed reports whether r holds its key by a row claimed in a
// transaction of its own, whose version orders it among the key's claims:
// two-phase, Config.DB, a resumption, a one-commit entry point on a key
// that had a row. Not a one-commit execution's lock (no version), nor a
// claim in the caller's transaction (rolled back, its version is claimed
// again).
func rowClaimed(r *histRun) bool {
	return r.Version > 0 && (r.Mode == entryDo2 || r.Mode == entryDoSQL || r.Mode == modeResume || strings.HasSuffix(r.Mode, rowSuffix))
}

// stoodStillBefore reports whether r's process was paused, or stalled,
// within the lease before r started: it may have started on a claim it
// had checked before it stood still, one taken over since (I4's limits);
// its writes are fenced.
func (c *checker) stoodStillBefore(r *histRun) bool {
	return c.pausedDuring(r.Worker, r.Start.Add(-c.h.Lease), r.Start)
}

// crossMode puts a violation between a and b down to bug3 when one of
// them held its key by a one-commit transaction's lock and the other by a
// row (two-phase, the caller's transaction, Config.DB, a resumption).
func crossMode(a, b *histRun, same string) string {
	switch {
	case oneCommit(a) != oneCommit(b):
		return bug3
	case oneCommit(a):
		return same
	}
	return bugOther
}

// overran reports whether r ran past its lease: it was stopped by its
// canceled context (or found its lease lost at once), or ran longer than
// the lease.
func (c *checker) overran(r *histRun) bool {
	return r.Result == "canceled" || r.Result == "lost" || (!r.End.IsZero() && r.End.Sub(r.Start) >= c.h.Lease)
}

// checkEffects checks the business rows against the keys' rows: exactly
// one per completed key, the run its stored answer names, and none for
// any other key; and that no key is left in progress.
func (c *checker) checkEffects() {
	refs := map[string]bool{}
	for ref := range c.h.Effects {
		refs[ref] = true
	}
	for ref := range c.h.Keys {
		refs[ref] = true
	}
	for _, ref := range slices.Sorted(maps.Keys(refs)) {
		effects, k := c.h.Effects[ref], c.h.Keys[ref]
		if k.Status == "in_progress" {
			c.addf(vUnsettled, bugOther, "%s: in progress after every caller stopped and the leases ended", ref)
		}
		switch {
		case k.Status == "completed" && len(effects) != 1:
			c.addf(vEffects, bugOther, "%s: completed (answer of %s) with %d business rows %v", ref, k.RunID, len(effects), effects)
		case k.Status == "completed" && effects[0] != k.RunID:
			c.addf(vEffects, bugOther, "%s: completed with the answer of %s but the business row of %s", ref, k.RunID, effects[0])
		case k.Status != "completed" && len(effects) > 0:
			c.addf(vEffects, bugOther, "%s: %q (not completed) with business rows %v", ref, k.Status, effects)
		}
		for _, id := range effects {
			for _, r := range c.byKey[ref] {
				if r.ID == id {
					c.committed[ref] = r
				}
			}
		}
	}
}

// checkOverlaps: no two runs of a key at once (I4).
func (c *checker) checkOverlaps(ref string) {
	runs := c.byKey[ref]
	for i, a := range runs {
		slack := time.Duration(0)
		if a.Result == "canceled" {
			slack = canceledSlack
		}
		for _, b := range runs[i+1:] {
			if !b.Start.Before(c.end[a].Add(-slack)) {
				break // sorted by start: no later run starts sooner
			}
			if c.stale[b] == a {
				continue // checkClaimOrder said so
			}
			// Two holders of the lock at once: the first must have given it
			// up at its step's promotion (the claim row holds the key from
			// then on), which the second's probe did not see: bug1.
			c.addf(vOverlap, crossMode(a, b, bug1), "%s: %s overlaps %s", ref, c.describe(a), c.describe(b))
		}
	}
}

// checkAfterCommit: no run of a key starts after a run of it that
// committed has ended (I13): the key is held from that run's start until
// its commit, and completed after. A run that found its lease lost at once
// after its process stood still did nothing (I4's limits); one that started
// on a claim older than the committed run's is bug6.
func (c *checker) checkAfterCommit(ref string) {
	a := c.committed[ref]
	if a == nil {
		return
	}
	for _, b := range c.byKey[ref] {
		if b == a || !b.Start.After(c.end[a]) || c.stale[b] != nil || (b.Result == "lost" && c.stoodStillBefore(b)) {
			continue
		}
		bug := crossMode(a, b, bug1)
		if rowClaimed(a) && rowClaimed(b) && b.Version < a.Version {
			bug = bug6
		}
		c.addf(vAfterCommit, bug, "%s: %s started after committed %s", ref, c.describe(b), c.describe(a))
	}
}

// checkClaimOrder judges the runs that hold their key by a row claimed on
// its own (rowClaimed) by the order of their claims, their versions,
// rather than by when their starts were recorded: a claim takes a key over
// only once the lease of the claim before it ran out in Postgres, and a
// handler starts only while its claim's lease holds, so the run of an
// older claim started before the run of a newer one. One that started
// after it started on a claim taken over already: bug6 — unless its
// process stood still before it started (a pause, a stall: it checked its
// lease before).
func (c *checker) checkClaimOrder(ref string) {
	for _, b := range c.byKey[ref] {
		if !rowClaimed(b) || c.stoodStillBefore(b) {
			continue
		}
		for _, a := range c.byKey[ref] { // by start
			if !a.Start.Before(b.Start) {
				break
			}
			if rowClaimed(a) && a.Version > b.Version {
				c.stale[b] = a
				c.addf(vStaleStart, bug6, "%s: %s started after %s, of a later claim, had started", ref, c.describe(b), c.describe(a))
				break
			}
		}
	}
}

// checkPayloads: once a run of a key left a row (every run does but one
// in a caller's transaction, one whose process died or stopped, and an
// overrun of a one-commit execution), no run with another payload runs
// (I3). A key that accepted another payload after an overrun, with no row
// before, is put down to bug5; a one-commit run of another payload right
// after a failed one-commit run, to bug2.
func (c *checker) checkPayloads(ref string) {
	var owner, overrun *histRun
	for _, b := range c.byKey[ref] {
		switch {
		case owner != nil && b.Payload != owner.Payload && b.Start.After(c.end[owner]):
			bug := bugOther
			switch {
			case owner == c.committed[ref]:
				bug = crossMode(owner, b, bug1) // b ran after owner committed: as checkAfterCommit
			case oneCommit(owner) && owner.Result != "ok" && (oneCommit(b) || c.claimedBefore(b, c.calls[owner.Attempt].End)):
				// b took the lock, or claimed a row, before owner's failed
				// row was written (it is, before owner's call returns).
				bug = bug2
			}
			c.addf(vOtherPayload, bug, "%s: %s ran after %s had left its row", ref, c.describe(b), c.describe(owner))
			if c.leftRow(b) {
				owner = b // the key's row may be b's from now on: no cascade
			}
		case owner == nil && overrun != nil && b.Payload != overrun.Payload && b.Start.After(c.end[overrun]):
			c.addf(vOtherPayload, bug5, "%s: %s ran after the overrun %s left no row", ref, c.describe(b), c.describe(overrun))
			overrun = nil
		}
		switch {
		case lockHeld(b) && c.overran(b) && !c.paused[b]:
			if overrun == nil {
				overrun = b
			}
		case owner == nil && c.leftRow(b):
			owner = b
		}
	}
}

// leftRow reports whether r certainly left a row of its key's, with its
// payload's fingerprint: a run that claims a row (two-phase, Config.DB, a
// resumption, a one-commit entry point on a key that had a row) does,
// unless its process died or stopped; a one-commit run does when its
// caller was told its result or its failure (its commit or its failed row
// went through), not when it was told its lease was lost, which a
// one-commit execution is told when another row refused its own; a run
// in the caller's transaction leaves none when it fails.
func (c *checker) leftRow(r *histRun) bool {
	switch {
	case r.End.IsZero() || c.paused[r] || callerTxModes[r.Mode]:
		return false
	case !lockHeld(r):
		return true
	}
	call, ok := c.calls[r.Attempt]
	return ok && (call.Told == toldOK || call.Told == toldFailed || call.Told == toldPanic || call.Told == toldDeadLetter)
}

// checkCalls checks what callers were told: a committed run's caller was
// told its result; every result told is the committed one; and a caller
// told its execution was taken over (ErrLeaseLost) had one that something
// took over.
func (c *checker) checkCalls() {
	calls := slices.Clone(c.h.Calls)
	slices.SortFunc(calls, func(a, b histCall) int { return a.Start.Compare(b.Start) })
	for _, call := range calls {
		ref := refOf(call.Scope, call.Key)
		committed := c.committed[ref]
		own := c.byAttempt[call.Attempt]
		if own != nil && own == committed && call.Told != toldOK && call.Told != toldUnavailable {
			bug := bugOther
			if call.Told == toldLost {
				bug = bugLostAfterCommit
			}
			c.addf(vCommittedTold, bug, "%s: %s committed, its caller (%s, %s–%s) was told %s %s", ref, c.describe(own), call.Entry,
				call.Start.Format("15:04:05.000"), call.End.Format("15:04:05.000"), call.Told, call.Detail)
		}
		switch call.Told {
		case toldOK, toldReplayed:
			switch {
			case committed == nil:
				c.addf(vWrongResult, bugOther, "%s: %s caller told %s of %s, which did not commit (nothing did)", ref, call.Entry, call.Told, call.RunID)
			case call.RunID != committed.ID:
				c.addf(vWrongResult, bugOther, "%s: %s caller told %s of %s, but %s committed", ref, call.Entry, call.Told, call.RunID, committed.ID)
			}
		case toldLost:
			c.checkLost(ref, call, own)
		}
	}
}

// checkLost judges a caller told its execution was taken over (or its
// lease lost). Its process standing still during the call excuses it, and
// so does a run that committed the key before it started (it should not
// have run at all: checkAfterCommit or checkOverlaps says so). An
// execution that holds its key by a one-commit transaction's lock can
// only be told so wrongly — nothing takes a lock over: an overrun (its
// handler, or the whole call, outlived the lease; Postgres ended it and
// no row is left) is bug5 unless something really ran within its lease;
// right after a failed one-commit run it is bug2 (that run's failed row
// came after the lock was released and refused this run's commit,
// whatever else ran meanwhile). Otherwise the answer is right when
// something ran beside it or claimed the key before its call returned
// (a run of a row-claiming entry point whose call began by then),
// or when the call outlived the lease (the engine gives a lease it could
// not renew up a sixth of it before its end: on a starved machine too).
func (c *checker) checkLost(ref string, call histCall, r *histRun) {
	if c.pausedDuring(call.Worker, call.Start, call.End) {
		return
	}
	took := call.End.Sub(call.Start)
	expired := took >= c.h.Lease*5/6
	if r == nil {
		if !expired {
			c.addf(vLostNoTakeover, bugOther, "%s: %s caller told lost after %s, but no run of its call is recorded", ref, call.Entry, took.Round(time.Millisecond))
		}
		return
	}
	if c.paused[r] {
		return
	}
	if a := c.committed[ref]; a != nil && a != r && a.Start.Before(r.Start) {
		return
	}
	var prev, next *histRun
	for _, b := range c.byKey[ref] {
		switch {
		case b == r:
		case b.Start.Before(r.Start):
			prev = b
		case next == nil:
			next = b
		}
	}
	ranBeside := func(until time.Time) *histRun {
		for _, b := range c.byKey[ref] {
			if b != r && (b.Start.Before(until) || c.claimedBefore(b, until)) && c.end[b].After(r.Start) {
				return b
			}
		}
		return nil
	}
	before := "no run before"
	if prev != nil {
		before = "after " + c.describe(prev)
	}
	if next != nil {
		before += ", before " + c.describe(next)
	}
	switch {
	case lockHeld(r) && (c.overran(r) || took >= c.h.Lease):
		if ranBeside(r.Start.Add(c.h.Lease)) == nil {
			c.addf(vLostNoTakeover, bug5, "%s: %s overran (call %s), its caller (%s) told %s; %s", ref, c.describe(r), took.Round(time.Millisecond), call.Entry, call.Told, before)
		}
		return
	case lockHeld(r) && prev != nil && oneCommit(prev) && prev.Result != "ok" && !c.end[prev].After(r.Start):
		c.addf(vLostNoTakeover, bug2, "%s: %s caller (%s) told %s right %s", ref, c.describe(r), call.Entry, call.Told, before)
		return
	}
	b := ranBeside(call.End)
	switch {
	case b == nil && !expired && lockHeld(r) && c.claimedBeside(ref, r, call) != nil:
		o := c.claimedBeside(ref, r, call)
		c.addf(vHeldCommit, bug3, "%s: a %s call (%s–%s, told %s, its handler never ran) claimed the key beside %s (its caller told lost)",
			ref, o.Entry, o.Start.Format("15:04:05.000"), o.End.Format("15:04:05.000"), o.Told, c.describe(r))
	case b == nil && !expired:
		c.addf(vLostNoTakeover, bugOther, "%s: %s caller (%s) told %s after %s; %s", ref, c.describe(r), call.Entry, call.Told, took.Round(time.Millisecond), before)
	case b != nil && lockHeld(r) && !oneCommit(b) && b.Start.After(r.End):
		c.addf(vHeldCommit, bug3, "%s: %s claimed the key while %s was committing (its caller told lost)", ref, c.describe(b), c.describe(r))
	}
}

// claimedBefore reports whether b holds its key by a row it may have
// claimed before t: its call began by then (its run's start is recorded
// after the claim, late on a starved machine).
func (c *checker) claimedBefore(b *histRun, t time.Time) bool {
	call, ok := c.calls[b.Attempt]
	return ok && !oneCommit(b) && call.Start.Before(t)
}

// claimedBeside returns a call of ref's key, beside r's, through an entry
// point that claims a row (two-phase, Config.DB, a caller's transaction)
// whose handler never ran: its claim may have taken the key from r.
func (c *checker) claimedBeside(ref string, r *histRun, call histCall) *histCall {
	for i := range c.h.Calls {
		o := &c.h.Calls[i]
		if refOf(o.Scope, o.Key) == ref && o.Attempt != call.Attempt && !oneCommitModes[o.Entry] &&
			c.byAttempt[o.Attempt] == nil && o.Start.Before(call.End) && o.End.After(r.Start) {
			return o
		}
	}
	return nil
}

// pausedDuring reports whether worker was paused at some time between
// from and to.
func (c *checker) pausedDuring(worker string, from, to time.Time) bool {
	for _, p := range c.h.Pauses {
		if p.Worker == worker && p.From.Before(to) && p.To.After(from) {
			return true
		}
	}
	return false
}

// violationSummary counts violations by kind and by bug, with a few
// examples of each kind, for the test's log.
type violationSummary struct {
	ByKind   map[string]int      `json:"by_kind"`
	ByBug    map[string]int      `json:"by_bug"`
	Examples map[string][]string `json:"examples"`
}

func summarize(vs []violation, examples int) violationSummary {
	s := violationSummary{ByKind: map[string]int{}, ByBug: map[string]int{}, Examples: map[string][]string{}}
	for _, v := range vs {
		s.ByKind[v.Kind]++
		s.ByBug[v.Bug]++
		if len(s.Examples[v.Kind]) < examples {
			s.Examples[v.Kind] = append(s.Examples[v.Kind], "("+v.Bug+") "+v.Text)
		}
	}
	return s
}

// String is the summary as a few lines, rates per minute of minutes.
func (s violationSummary) format(minutes float64) string {
	var b strings.Builder
	for _, bug := range slices.Sorted(maps.Keys(s.ByBug)) {
		fmt.Fprintf(&b, "  %-55s %5d  (%.1f/min)\n", bug, s.ByBug[bug], float64(s.ByBug[bug])/minutes)
	}
	for _, kind := range slices.Sorted(maps.Keys(s.ByKind)) {
		fmt.Fprintf(&b, "  %s: %d\n", kind, s.ByKind[kind])
		for _, e := range s.Examples[kind] {
			fmt.Fprintf(&b, "      %s\n", e)
		}
	}
	return b.String()
}
