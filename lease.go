package onceonly

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// leaseKeeper renews every lease this engine holds, every third of
// LeaseTimeout, in one statement on a Postgres connection of its own: a
// renewal never waits for a pool connection a handler holds. A lease whose
// renewal has not succeeded in time is given up a margin before it ends
// (its execution is canceled and can no longer record a step or commit),
// so a takeover never runs beside a live execution (I4).
type leaseKeeper struct {
	store  *outbox.Store
	config *pgx.ConnConfig
	lease  time.Duration
	log    func(msg string, args ...any)

	mu      sync.Mutex
	leases  map[keystate.Owner]*lease
	running bool
	closed  bool
	conn    *pgx.Conn
	stop    chan struct{}
	done    chan struct{}
}

// lease is one execution's hold on its key, as this process sees it.
type lease struct {
	ref    keystate.Ref
	owner  keystate.Owner
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	validUntil time.Time // a margin before Postgres's lease_expires_at, by our clock
	lost       bool
	timer      *time.Timer
}

// margin is how long before the lease ends its holder is stopped: the
// clocks of this process and Postgres, and the time a statement takes to
// reach Postgres, never eat it all.
func (k *leaseKeeper) margin() time.Duration { return k.lease / 6 }

// hold registers the lease owner took at claimedAt (the time the claim was
// sent: Postgres's lease runs from later) and starts renewing it. cancel
// stops the execution when the lease is lost.
func (k *leaseKeeper) hold(ctx context.Context, ref keystate.Ref, owner keystate.Owner, claimedAt time.Time, cancel context.CancelCauseFunc) *lease {
	l := k.fixed(ref, owner, claimedAt, cancel)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.leases[owner] = l
	if !k.running && !k.closed {
		k.running = true
		k.stop, k.done = make(chan struct{}), make(chan struct{})
		// The renewals outlive the request that started them.
		go k.run(context.WithoutCancel(ctx), k.stop, k.done)
	}
	return l
}

// fixed returns a lease that is never renewed: it ends LeaseTimeout, less
// the margin, after start, and cancels its execution then. A single-commit
// execution holds one (its transaction must end within the lease, which
// Postgres enforces as well); hold renews the others.
func (k *leaseKeeper) fixed(ref keystate.Ref, owner keystate.Owner, start time.Time, cancel context.CancelCauseFunc) *lease {
	l := &lease{ref: ref, owner: owner, cancel: cancel, validUntil: start.Add(k.lease - k.margin())}
	l.timer = time.AfterFunc(time.Until(l.validUntil), func() { l.expire(ErrLeaseLost) })
	return l
}

// release stops renewing l (its execution is over).
func (k *leaseKeeper) release(l *lease) {
	l.timer.Stop()
	k.mu.Lock()
	delete(k.leases, l.owner)
	k.mu.Unlock()
}

// valid reports whether the lease still holds with its margin.
func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && time.Now().Before(l.validUntil)
}

// extend moves the lease's end after a renewal sent at sentAt.
func (l *lease) extend(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost || !until.After(l.validUntil) {
		return
	}
	l.validUntil = until
	l.timer.Reset(time.Until(until))
}

// expire gives the lease up: the execution is canceled with cause.
func (l *lease) expire(cause error) {
	l.mu.Lock()
	l.lost = true
	l.mu.Unlock()
	l.cancel(cause)
}

// run renews the leases until none is left or the keeper closes.
func (k *leaseKeeper) run(ctx context.Context, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(k.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if k.idle() {
			// The goroutine and its connection go; the next lease that
			// lives to a tick opens a new one (short executions never do).
			k.closeConn(ctx)
			if k.stopIfIdle() {
				return
			}
			continue
		}
		k.mu.Lock()
		held := make([]*lease, 0, len(k.leases))
		for _, l := range k.leases {
			held = append(held, l)
		}
		k.mu.Unlock()
		k.renew(ctx, held)
	}
}

func (k *leaseKeeper) idle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.leases) == 0
}

// stopIfIdle marks the keeper stopped if it still holds no lease; a lease
// registered after that starts a new goroutine.
func (k *leaseKeeper) stopIfIdle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.leases) > 0 {
		return false
	}
	k.running = false
	return true
}

// renew extends held in one statement and gives up the leases Postgres no
// longer has under their owner.
func (k *leaseKeeper) renew(ctx context.Context, held []*lease) {
	ctx, cancel := context.WithTimeout(ctx, k.lease/3)
	defer cancel()
	sentAt := time.Now()
	if k.conn == nil || k.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, k.config)
		if err != nil {
			k.log("lease renewal: connect", "err", err)
			return
		}
		k.conn = conn
	}
	leases := make([]outbox.Lease, len(held))
	for i, l := range held {
		leases[i] = outbox.Lease{Ref: l.ref, Owner: l.owner}
	}
	still, err := k.store.RenewLeases(ctx, k.conn, leases, k.lease)
	if err != nil {
		k.log("lease renewal failed; executions stop before their leases end unless a renewal succeeds", "leases", len(held), "err", err)
		_ = k.conn.Close(context.WithoutCancel(ctx))
		k.conn = nil
		return
	}
	until := sentAt.Add(k.lease - k.margin())
	for _, l := range held {
		if still[l.owner] {
			l.extend(until)
		} else {
			l.expire(ErrLeaseLost)
		}
	}
}

// close stops the keeper and closes its connection.
func (k *leaseKeeper) close(ctx context.Context) {
	k.mu.Lock()
	k.closed = true
	running, stop, done := k.running, k.stop, k.done
	k.running = false
	k.mu.Unlock()
	if running {
		close(stop)
		<-done
	}
	k.closeConn(ctx)
}

// closeConn closes the renewal connection; only the goroutine that renews,
// or close once it stopped, calls it.
func (k *leaseKeeper) closeConn(ctx context.Context) {
	if k.conn == nil {
		return
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = k.conn.Close(closeCtx)
	k.conn = nil
}
