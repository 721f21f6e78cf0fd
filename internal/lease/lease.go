// Package lease keeps the leases of an engine's executions: it renews each
// on a Postgres connection of its own and stops an execution whose lease
// can no longer be renewed in time.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
	"github.com/onceonly/onceonly/startstop"
)

// Keeper renews the leases this engine holds, on a Postgres connection
// of its own: a renewal never waits for a pool connection a handler holds.
//
// Each lease is renewed once a third of it has passed since its claim or
// its last renewal was sent, so half the lease is left for the renewal to
// land before the holder is stopped; the leases that fall due within a
// sixth of the lease go in the same statement. A renewal that fails is sent
// again at once (after a short pause) on a new connection, and one that has
// not answered after a sixth of the lease is joined by a second on a new
// connection (a connection can die without a word, and a slow one may still
// answer): the first answer counts. A lease no renewal has extended in time
// is given up a margin before it ends (its execution is canceled and can
// no longer record a step or commit), so a takeover never runs beside a
// live execution (I4).
//
// The connection stays open while leases are held and for one lease after
// the last one goes, so a renewal seldom dials; executions shorter than a
// third of the lease never cause a renewal.
type Keeper struct {
	store  *outbox.Store
	config *pgx.ConnConfig
	lease  time.Duration
	log    func(msg string, args ...any)

	// renewer is the goroutine that renews: it runs while leases are held
	// and stops itself once none has been for linger.
	renewer startstop.Base

	mu       sync.Mutex
	leases   map[keystate.Owner]*Lease
	running  bool // the renewer runs, or is starting
	closed   bool
	nextWake time.Time     // when the sleeping renewer next looks; zero while it is awake
	wake     chan struct{} // wakes the renewer: a lease falls due before nextWake

	conn *pgx.Conn // only the renewing goroutine, or close once it stopped, uses it
}

// NewKeeper returns a Keeper of leases of length lease, renewed through
// store on connections made from config; log receives its warnings.
func NewKeeper(store *outbox.Store, config *pgx.ConnConfig, lease time.Duration, log func(msg string, args ...any)) *Keeper {
	return &Keeper{
		store: store, config: config, lease: lease, log: log,
		leases: map[keystate.Owner]*Lease{}, wake: make(chan struct{}, 1),
	}
}

// Lease is one execution's hold on its key, as this process sees it.
type Lease struct {
	ref    keystate.Ref
	owner  keystate.Owner
	onLost func() // stops the execution

	mu         sync.Mutex
	validUntil time.Time // a margin before Postgres's lease_expires_at, by our clock
	lost       bool
	released   bool
	timer      *time.Timer
	kept       chan struct{} // closed at Release, for a Kept lease's keeper
}

// margin is how long before the lease ends its holder is stopped: the
// clocks of this process and Postgres, and the time a statement takes to
// reach Postgres, never eat it all.
func (k *Keeper) margin() time.Duration { return k.lease / 6 }

// renewBelow: a lease is due for renewal when no more than this is left of
// its validity (a third of the lease after the renewal or claim that set
// it was sent).
func (k *Keeper) renewBelow() time.Duration { return k.lease / 2 }

// renewAhead: the leases that fall due within this go with the ones due
// now, in the same statement.
func (k *Keeper) renewAhead() time.Duration { return k.lease / 6 }

// hedgeAfter: a renewal that has not answered after this is joined by a
// second on a new connection.
func (k *Keeper) hedgeAfter() time.Duration { return k.lease / 6 }

// linger: the connection and the goroutine stay this long after the last
// lease went.
func (k *Keeper) linger() time.Duration { return k.lease }

// maxPause bounds the pause between failed renewals (Postgres refusing
// connections must not make the keeper spin).
func (k *Keeper) maxPause() time.Duration { return k.lease / 12 }

// renewAt is when l falls due for renewal.
func (k *Keeper) renewAt(validUntil time.Time) time.Time {
	return validUntil.Add(-k.renewBelow())
}

// Hold registers the lease owner took at claimedAt (the time the claim was
// sent: Postgres's lease runs from later) and renews it until it is
// released. onLost stops the execution when the lease is lost.
func (k *Keeper) Hold(ctx context.Context, ref keystate.Ref, owner keystate.Owner, claimedAt time.Time, onLost func()) *Lease {
	l := k.Fixed(ref, owner, claimedAt, onLost)
	k.register(ctx, l, claimedAt)
	return l
}

// Renew turns l, a Fixed lease, into one Hold would have returned for a
// claim sent at claimedAt: its end moves to a lease after claimedAt, and
// it is renewed from then on until it is released. A single-commit
// execution whose first step committed its claim (a promotion) goes on
// under it. A lost or released lease stays so.
func (k *Keeper) Renew(ctx context.Context, l *Lease, claimedAt time.Time) {
	l.extend(claimedAt.Add(k.lease - k.margin()))
	k.register(ctx, l, claimedAt)
}

// register hands l, whose claim was sent at claimedAt, to the renewer,
// starting it when it does not run.
func (k *Keeper) register(ctx context.Context, l *Lease, claimedAt time.Time) {
	due := k.renewAt(claimedAt.Add(k.lease - k.margin()))
	k.mu.Lock()
	defer k.mu.Unlock()
	k.leases[l.owner] = l
	switch {
	case k.closed:
	case !k.running:
		k.running = true
		k.nextWake = time.Time{}
		// The renewals outlive the request that started them.
		k.startRenewer(context.WithoutCancel(ctx))
	case k.nextWake.IsZero() || due.Before(k.nextWake):
		// The renewer is awake (it may have scheduled before this lease
		// came) or sleeps past this lease's renewal: it looks again.
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// Fixed returns a lease that is never renewed: it ends LeaseTimeout, less
// the margin, after start, and cancels its execution then. A single-commit
// execution holds one (its transaction must end within the lease, which
// Postgres enforces as well); Hold renews the others.
func (k *Keeper) Fixed(ref keystate.Ref, owner keystate.Owner, start time.Time, onLost func()) *Lease {
	l := &Lease{ref: ref, owner: owner, onLost: onLost, validUntil: start.Add(k.lease - k.margin())}
	l.timer = time.AfterFunc(time.Until(l.validUntil), l.deadline)
	return l
}

// ErrKeptOtherwise is what a Kept lease's keep returns once the execution's
// key is held otherwise (a row the keeper renews): the keeping ends
// quietly.
var ErrKeptOtherwise = errors.New("lease: the key is held otherwise now")

// ErrKeepLater is what a Kept lease's keep returns when it can neither
// prove nor disprove the execution alive now: the lease is not extended,
// and keep runs again a third of the lease later.
var ErrKeepLater = errors.New("lease: nothing to keep alive with now")

// Kept returns a Fixed lease that keep extends (with ctx's values, not its
// end), for an execution whose
// key is held by its own open transaction (a single-commit execution):
// once a third of the lease has passed since start, and a third of it after
// each keep that succeeded, keep runs; one that succeeds moves the lease's
// end to a lease, less the margin, after it was sent. keep is the proof of
// life Postgres sees (it restarts the transaction's idle timeout, which is
// the lease), so an execution whose process lives is never ended for being
// slow, and one whose process died or hangs keeps nothing alive. A keep
// that fails ends the keeping: the lease runs out at its end.
func (k *Keeper) Kept(ctx context.Context, ref keystate.Ref, owner keystate.Owner, start time.Time, onLost func(), keep func(context.Context) error) *Lease {
	l := k.Fixed(ref, owner, start, onLost)
	l.kept = make(chan struct{})
	go k.keep(context.WithoutCancel(ctx), l, start, keep) // the keeping ends with the lease, not with ctx
	return l
}

// keep runs keep for l every third of the lease from start, until l is
// released or a keep fails; each keep gets ctx's values.
func (k *Keeper) keep(ctx context.Context, l *Lease, start time.Time, keep func(context.Context) error) {
	period := k.lease / 3
	timer := time.NewTimer(time.Until(start.Add(period)))
	defer timer.Stop()
	for {
		select {
		case <-l.kept:
			return
		case <-timer.C:
		}
		sent := time.Now()
		// Until the lease ends: a keep cut short earlier could end the
		// transaction it keeps (a canceled statement's connection may be
		// closed), and one that lands later is too late anyway.
		until, _ := l.state()
		kctx, cancel := context.WithDeadline(ctx, until)
		err := keep(kctx)
		cancel()
		switch {
		case errors.Is(err, ErrKeptOtherwise):
			return
		case errors.Is(err, ErrKeepLater):
			timer.Reset(period)
			continue
		}
		if err != nil {
			k.log("keeping an execution's transaction alive failed; its lease runs out",
				"scope", l.ref.Scope, "key", l.ref.Key, "err", err)
			return
		}
		l.extend(sent.Add(k.lease - k.margin()))
		timer.Reset(time.Until(sent.Add(period)))
	}
}

// Release stops renewing l (its execution is over); a nil l is ignored.
func (k *Keeper) Release(l *Lease) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.kept != nil && !l.released {
		close(l.kept)
	}
	l.released = true
	l.timer.Stop()
	l.mu.Unlock()
	k.mu.Lock()
	delete(k.leases, l.owner)
	k.mu.Unlock()
}

// Valid reports whether the lease still holds with its margin. A nil
// lease, that of an execution whose key is held otherwise (an uncommitted
// row), always holds.
func (l *Lease) Valid() bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && time.Now().Before(l.validUntil)
}

// state returns the lease's end and whether it is still held (not lost,
// not released).
func (l *Lease) state() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil, !l.lost && !l.released
}

// extend moves the lease's end to until, which a renewal set: the time it
// was sent plus the lease, less the margin. It never moves the end back,
// nor revives a lease that was lost.
func (l *Lease) extend(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost || l.released || !until.After(l.validUntil) {
		return
	}
	l.validUntil = until
	l.timer.Reset(time.Until(until))
}

// deadline runs when the lease's timer fires: the lease is lost unless a
// renewal moved its end meanwhile (the timer fired as it was reset).
func (l *Lease) deadline() {
	l.mu.Lock()
	extended := time.Now().Before(l.validUntil)
	l.mu.Unlock()
	if !extended {
		l.expire()
	}
}

// expire gives the lease up: its execution is stopped (onLost).
func (l *Lease) expire() {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return
	}
	l.lost = true
	l.mu.Unlock()
	l.onLost()
}

// startRenewer starts the renewer, once the one before it, which found
// itself idle, has returned (it holds no lock as it returns). Called under
// k.mu with running just set.
func (k *Keeper) startRenewer(ctx context.Context) {
	<-k.renewer.Stopped()
	ctx, ok, started, stopped := k.renewer.StartInit(ctx)
	if !ok {
		return // unreachable: running was false, so no renewer runs
	}
	go func() {
		defer stopped()
		started()
		k.run(ctx)
	}()
}

// run renews the leases as they fall due until none has been left for
// linger, or the keeper closes (ctx ends).
func (k *Keeper) run(ctx context.Context) {
	var idleSince time.Time
	for {
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		due, next, idle := k.schedule(now)
		if len(due) > 0 {
			k.renew(ctx, due)
			continue
		}
		switch {
		case !idle:
			idleSince = time.Time{}
			if next.IsZero() { // only lost leases, not released yet
				next = now.Add(k.renewAhead())
			}
		case idleSince.IsZero():
			idleSince = now
			next = now.Add(k.linger())
		case now.Sub(idleSince) >= k.linger():
			// The goroutine and its connection go; the next lease that
			// falls due opens a new one.
			k.closeConn(ctx)
			if k.stopIfIdle() {
				return
			}
			idleSince = time.Time{}
			continue
		default:
			next = idleSince.Add(k.linger())
		}
		if !k.sleep(ctx, next) {
			return
		}
	}
}

// sleep waits until next, a wake-up or the end of ctx; it reports false
// when ctx ended.
func (k *Keeper) sleep(ctx context.Context, next time.Time) bool {
	k.mu.Lock()
	k.nextWake = next
	k.mu.Unlock()
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-k.wake:
	case <-t.C:
	}
	return true
}

// schedule returns the leases to renew now (due, or due within
// renewAhead), when the next of the others falls due (zero if none), and
// whether no lease is held at all.
func (k *Keeper) schedule(now time.Time) (due []*Lease, next time.Time, idle bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.nextWake = time.Time{} // awake: every hold wakes it again
	if len(k.leases) == 0 {
		return nil, time.Time{}, true
	}
	ahead := now.Add(k.renewAhead())
	for _, l := range k.leases {
		until, held := l.state()
		if !held || !now.Before(until) {
			continue // lost: its timer stops it, and nothing can renew it
		}
		at := k.renewAt(until)
		if !at.After(ahead) {
			due = append(due, l)
		} else if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return due, next, false
}

// stopIfIdle marks the keeper stopped if it still holds no lease; a lease
// registered after that starts a new goroutine.
func (k *Keeper) stopIfIdle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.leases) > 0 {
		return false
	}
	k.running = false
	return true
}

// renewal is the answer to one attempt at renewing leases.
type renewal struct {
	conn   *pgx.Conn // the attempt's connection, open after a success
	sentAt time.Time // when the statement went: Postgres's now() is later
	still  map[keystate.Owner]bool
	err    error
}

// renew extends held in one statement and gives up the leases Postgres no
// longer has under their owner. Until one attempt answers, or the last of
// held has ended, a failed attempt is made again after a short pause, and
// an attempt that has not answered after hedgeAfter is joined by a second,
// each on a connection of its own; the first answer counts.
func (k *Keeper) renew(ctx context.Context, held []*Lease) {
	var end time.Time // past it, no lease of held can be renewed in time
	leases := make([]outbox.Lease, len(held))
	for i, l := range held {
		leases[i] = outbox.Lease{Ref: l.ref, Owner: l.owner}
		if until, _ := l.state(); until.After(end) {
			end = until
		}
	}
	if !time.Now().Before(end) {
		return // lost already: their timers stop them
	}
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()

	results := make(chan renewal, 2)
	inFlight := 0
	hedge := time.NewTimer(k.hedgeAfter())
	defer hedge.Stop()
	start := func(conn *pgx.Conn) {
		inFlight++
		hedge.Reset(k.hedgeAfter())
		go func() { results <- k.attempt(ctx, conn, leases) }()
	}
	// finish waits for the attempts still under way (ctx is canceled) and
	// closes their connections.
	finish := func() {
		cancel()
		for ; inFlight > 0; inFlight-- {
			if r := <-results; r.conn != nil {
				closeQuietly(ctx, r.conn)
			}
		}
	}
	conn := k.conn
	k.conn = nil
	start(conn)

	var retry <-chan time.Time
	pause, failures := 10*time.Millisecond, 0
	for {
		select {
		case r := <-results:
			inFlight--
			if r.err == nil {
				finish()
				k.conn = r.conn
				until := r.sentAt.Add(k.lease - k.margin())
				for _, l := range held {
					if r.still[l.owner] {
						l.extend(until)
					} else {
						l.expire()
					}
				}
				if failures > 0 {
					k.log("lease renewal succeeded after failures", "leases", len(held), "failures", failures)
				}
				return
			}
			failures++
			if failures == 1 {
				k.log("lease renewal failed; trying again until the leases end, when their executions stop", "leases", len(held), "err", r.err)
			}
			if retry == nil {
				retry = time.After(pause)
				pause = min(2*pause, max(k.maxPause(), 10*time.Millisecond))
			}
		case <-retry:
			retry = nil
			if !anyHeld(held) {
				finish()
				return
			}
			if inFlight < 2 {
				start(nil)
			}
		case <-hedge.C:
			if !anyHeld(held) {
				finish()
				return
			}
			if inFlight == 1 {
				start(nil)
			}
		case <-ctx.Done():
			attempts := failures + inFlight
			finish()
			if !errors.Is(context.Cause(ctx), startstop.ErrStop) { // not the keeper closing
				k.log("lease renewal failed; executions stopped before their leases end", "leases", len(held), "attempts", attempts)
			}
			return
		}
	}
}

// anyHeld reports whether a lease of held is neither lost nor released.
func anyHeld(held []*Lease) bool {
	for _, l := range held {
		if _, ok := l.state(); ok {
			return true
		}
	}
	return false
}

// attempt renews leases on conn, or on a new connection when conn is nil
// or closed. After a failure the connection is closed.
func (k *Keeper) attempt(ctx context.Context, conn *pgx.Conn, leases []outbox.Lease) renewal {
	if conn == nil || conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, k.config)
		if err != nil {
			return renewal{err: fmt.Errorf("connect: %w", err)}
		}
		conn = c
	}
	sentAt := time.Now()
	still, err := k.store.RenewLeases(ctx, conn, leases, k.lease)
	if err != nil {
		closeQuietly(ctx, conn)
		return renewal{err: err}
	}
	return renewal{conn: conn, sentAt: sentAt, still: still}
}

// closeQuietly closes conn, waiting a second at most.
func closeQuietly(ctx context.Context, conn *pgx.Conn) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = conn.Close(closeCtx)
}

// Close stops the keeper and closes its connection.
func (k *Keeper) Close(ctx context.Context) {
	k.mu.Lock()
	k.closed = true
	k.running = false
	k.mu.Unlock()
	k.renewer.Stop()
	k.closeConn(ctx)
}

// closeConn closes the renewal connection; only the goroutine that renews,
// or close once it stopped, calls it.
func (k *Keeper) closeConn(ctx context.Context) {
	if k.conn == nil {
		return
	}
	closeQuietly(ctx, k.conn)
	k.conn = nil
}
