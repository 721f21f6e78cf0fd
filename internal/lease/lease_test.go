package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// keeperFixture is a Keeper on a database of the test's own, whose
// renewal connections go through dial.
type keeperFixture struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *outbox.Store
	k     *Keeper
}

func newKeeperFixture(t *testing.T, leaseTimeout time.Duration, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *keeperFixture {
	t.Helper()
	f := &keeperFixture{ctx: oncetest.Context(t), pool: oncetest.DB(t), store: outbox.New(outbox.Config{})}
	config := f.pool.Config().ConnConfig.Copy()
	if dial != nil {
		config.DialFunc = dial
	}
	config.RuntimeParams["application_name"] = "lease keeper"
	f.k = NewKeeper(f.store, config, leaseTimeout, func(msg string, args ...any) { t.Log(append([]any{msg}, args...)...) })
	t.Cleanup(func() { f.k.Close(context.Background()) })
	return f
}

// claim claims key and holds its lease in the keeper; lost receives an
// error when the keeper gives the lease up.
func (f *keeperFixture) claim(key string) (*Lease, <-chan error, error) {
	ref := keystate.Ref{Scope: "s", Key: key}
	owner := keystate.NewOwner()
	claimedAt := time.Now()
	res, err := f.store.Claim(f.ctx, f.pool, ref, "v1:fp", owner, f.k.lease)
	if err == nil && !res.Claimed {
		err = fmt.Errorf("not claimed: %+v", res)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("claim %s: %w", key, err)
	}
	lost := make(chan error, 1)
	l := f.k.Hold(f.ctx, ref, owner, claimedAt, func() {
		select {
		case lost <- errors.New("lease given up"):
		default:
		}
	})
	return l, lost, nil
}

// until returns the lease's end as the keeper sees it.
func (l *Lease) until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// requireMargin checks I4 on a lease the keeper holds: its holder stops a
// margin before Postgres's lease ends, at the latest. It may run outside
// the test's goroutine. The holder's end is read first: a renewal moves it
// only once its statement has committed, so Postgres, read after, has that
// renewal too (read the other way round, a renewal landing between the
// reads looks like a breach).
func (f *keeperFixture) requireMargin(t testing.TB, l *Lease, key string) {
	until := l.until()
	var end time.Time
	if err := f.pool.QueryRow(f.ctx, `SELECT lease_expires_at FROM idempotency_keys WHERE scope = 's' AND key = $1`, key).Scan(&end); err != nil {
		t.Errorf("lease of %s: %v", key, err)
		return
	}
	if end.Sub(until) < f.k.margin() {
		t.Errorf("%s: the holder stops at %s, less than the margin (%s) before Postgres's lease ends at %s",
			key, until.Format(time.RFC3339Nano), f.k.margin(), end.Format(time.RFC3339Nano))
	}
}

// faultyConn is a connection to Postgres that a test can make slow (every
// answer comes lag after the request that asked for it) or dead (what is
// written goes nowhere and no answer comes, as on a connection whose peer
// vanished; a deadline still ends a read).
type faultyConn struct {
	net.Conn
	lag  time.Duration
	dead atomic.Bool

	mu      sync.Mutex
	written bool // a request was written since the last read
}

func (c *faultyConn) Write(p []byte) (int, error) {
	if c.dead.Load() {
		return len(p), nil
	}
	c.mu.Lock()
	c.written = true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *faultyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	answer := c.written
	c.written = false
	c.mu.Unlock()
	if answer && c.lag > 0 {
		time.Sleep(c.lag) // the injected round-trip lag, not a wait for an event
	}
	return c.Conn.Read(p)
}

// TestLeaseKeeperOutlivesADeadConnection: the keeper's connection dies
// without a word after a renewal (its peer vanished: a failover, a NAT
// that forgot it), and every new connection is slow: each round trip
// takes lease/16, so a renewal on a new one (connect, prepare, execute)
// takes 3/16 of the lease. The renewal on the dead connection never
// answers; a second one on a new connection, started a sixth of the lease
// later, has a third of the lease to land, and the lease is kept. (With
// one global tick, each renewal waiting out the last one's timeout of a
// third of the lease, the renewal on a new connection had a sixth of the
// lease, and the lease was lost.)
func TestLeaseKeeperOutlivesADeadConnection(t *testing.T) {
	t.Parallel()
	const lease = 4800 * time.Millisecond
	var (
		mu    sync.Mutex
		conns []*faultyConn
	)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		fc := &faultyConn{Conn: c}
		if len(conns) > 0 {
			fc.lag = lease / 16
		}
		conns = append(conns, fc)
		return fc, nil
	}
	f := newKeeperFixture(t, lease, dial)
	l, lost, err := f.claim("k")
	require.NoError(t, err)
	claimed := l.until()

	// The first renewal, on a fast connection.
	oncetest.Eventually(t, lease, "the first renewal", func() bool { return l.until().After(claimed) })
	f.requireMargin(t, l, "k")
	first := l.until()
	mu.Lock()
	require.Len(t, conns, 1)
	conns[0].dead.Store(true)
	mu.Unlock()

	// The next one, through the dead connection and a slow new one.
	deadline := time.Now().Add(lease)
	for !l.until().After(first) {
		select {
		case cause := <-lost:
			t.Fatalf("lease lost (%v) %s after the last renewal sent", cause, time.Since(first.Add(-lease+f.k.margin())).Round(time.Millisecond))
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no renewal within a lease")
	}
	require.True(t, l.Valid())
	f.requireMargin(t, l, "k")
	f.k.Release(l)
	select {
	case cause := <-lost:
		t.Fatalf("lease lost: %v", cause)
	default:
	}
}

// TestLeaseKeeperHammer holds leases of random lengths (up to two leases)
// from many goroutines, while the keeper's connection is cut now and then,
// and checks that none is lost and that every holder would have stopped a
// margin before Postgres's lease ends (I4). With -race it checks the
// keeper's locking too. ONCEONLY_LEASE_HAMMER=30s runs it longer (to count
// losses on a loaded machine), ONCEONLY_LEASE_HAMMER_LEASE sets the lease,
// ONCEONLY_LEASE_HAMMER_CUTS=0 leaves the connection alone.
func TestLeaseKeeperHammer(t *testing.T) {
	t.Parallel()
	run, lease := 5*time.Second, 3*time.Second
	if d, err := time.ParseDuration(os.Getenv("ONCEONLY_LEASE_HAMMER")); err == nil {
		run = d
	}
	if d, err := time.ParseDuration(os.Getenv("ONCEONLY_LEASE_HAMMER_LEASE")); err == nil {
		lease = d
	}
	f := newKeeperFixture(t, lease, nil)
	const workers = 32
	var held, renewed, lostLeases, cuts atomic.Int64
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				l, lost, err := f.claim(key)
				if err != nil {
					t.Error(err)
					return
				}
				claimed := l.until()
				held.Add(1)
				// Mostly short executions, some that need a renewal or more.
				d := time.Duration(rand.Int64N(int64(lease / 10)))
				if rand.IntN(4) == 0 {
					d = time.Duration(rand.Int64N(int64(2 * lease)))
				}
				select {
				case cause := <-lost:
					lostLeases.Add(1)
					t.Errorf("%s: lease lost %s after the last renewal or claim was sent (%v)", key,
						time.Since(l.until().Add(-lease+f.k.margin())).Round(time.Millisecond), cause)
				case <-time.After(d):
					f.requireMargin(t, l, key)
				}
				if l.until().After(claimed) {
					renewed.Add(1)
				}
				f.k.Release(l)
			}
		})
	}
	wg.Go(func() { // cuts the keeper's connection now and then
		for os.Getenv("ONCEONLY_LEASE_HAMMER_CUTS") != "0" && time.Now().Before(stop) {
			time.Sleep(time.Duration(rand.Int64N(int64(lease)))) // the pace of the cuts, not a wait for an event
			var n int64
			if err := f.pool.QueryRow(f.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'lease keeper'`).Scan(&n); err == nil {
				cuts.Add(n)
			}
		}
	})
	wg.Wait()
	t.Logf("%d leases held, %d renewed at least once, %d lost; %d renewal connections cut", held.Load(), renewed.Load(), lostLeases.Load(), cuts.Load())
	require.Positive(t, renewed.Load())
	f.k.mu.Lock()
	require.Empty(t, f.k.leases, "every lease released")
	f.k.mu.Unlock()
}

// TestRenewerRestartsAfterIdle: the renewer stops itself once no lease has
// been held for a lease (linger), and the next lease held starts a new
// one, which renews it; Close stops a running renewer.
func TestRenewerRestartsAfterIdle(t *testing.T) {
	t.Parallel()
	const lease = 1500 * time.Millisecond
	f := newKeeperFixture(t, lease, nil)
	l, _, err := f.claim("first")
	require.NoError(t, err)
	f.k.Release(l)
	select {
	case <-f.k.renewer.Stopped():
	case <-time.After(4 * lease):
		t.Fatal("the renewer did not stop once idle")
	}
	l, lost, err := f.claim("second")
	require.NoError(t, err)
	claimed := l.until()
	select {
	case <-f.k.renewer.Started():
	case <-time.After(lease):
		t.Fatal("no renewer started for the next lease")
	}
	oncetest.Eventually(t, lease, "a renewal by the new renewer", func() bool { return l.until().After(claimed) })
	select {
	case cause := <-lost:
		t.Fatalf("lease lost: %v", cause)
	default:
	}
	f.k.Release(l)
	f.k.Close(context.Background())
	select {
	case <-f.k.renewer.Stopped():
	default:
		t.Fatal("Close returned before the renewer stopped")
	}
}
