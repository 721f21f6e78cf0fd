// Package claimbatch sends the claims of concurrent executions together,
// as group commit does: one statement and one commit for many keys.
package claimbatch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/onceonly/outbox"
)

// maxClaimBatch bounds how many claims one statement carries.
const maxClaimBatch = 64

// claimLockTimeout bounds how long a batch of claims waits for another
// transaction that inserted one of its keys and has not ended (see
// claim_batch.sql); past it the batch's claims are sent one by one. The
// claims of other batches commit without waiting for a flush, and a
// single-commit execution (the default) inserts its key just before its
// COMMIT, so their waits are short; the claims queued behind a batch wait
// as long as it.
const claimLockTimeout = 50 * time.Millisecond

// errClaimBatchPanicked is the error of the claims of a batch that
// panicked; they are then sent alone.
var errClaimBatchPanicked = errors.New("onceonly: the batch of claims panicked")

// Group sends the claims of concurrent executions together, as group
// commit does: while a batch of claims is in flight, the claims that
// arrive wait, and the next statement carries all of them (up to
// maxClaimBatch) in one round trip and one commit. A claim that arrives
// alone is sent at once. There is no goroutine of its own: the execution
// whose claim opens a batch sends it, then hands the waiting claims to one
// of their executions, which sends the next.
//
// A key that has a row (a replay, a conflict, a takeover) finishes its
// claim alone (outbox.Store.ClaimHeld), and so does every claim of a batch
// that failed (Postgres unreachable, a lock wait past claimLockTimeout):
// one bad batch costs its claims a round trip, never their answer.
type Group struct {
	store  *outbox.Store
	db     outbox.DB
	lease  time.Duration
	sizes  prometheus.Observer // claims per batch
	failed prometheus.Counter  // batches that failed

	mu      sync.Mutex
	queue   []*claimCall // claims waiting for a batch
	sending bool         // a batch is in flight
}

// New returns a Group that claims through store on db for leases of
// length lease; sizes observes the claims of each batch, failed counts the
// batches that failed.
func New(store *outbox.Store, db outbox.DB, lease time.Duration, sizes prometheus.Observer, failed prometheus.Counter) *Group {
	return &Group{store: store, db: db, lease: lease, sizes: sizes, failed: failed}
}

// claimCall is one execution's claim, waiting in a Group.
type claimCall struct {
	req outbox.ClaimRequest
	res outbox.ClaimResult
	err error // the batch's error
	// next receives false when a batch answered the claim (res, err), or
	// true when the claim's execution is to send the next batch.
	next chan bool
}

// Claim claims req.Ref for req.Owner, as outbox.Store.Claim does.
func (g *Group) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	c := &claimCall{req: req, next: make(chan bool, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	lead := !g.sending
	g.sending = true
	g.mu.Unlock()
	if lead || <-c.next {
		g.send(ctx)
	}
	switch {
	case c.err != nil:
		return g.store.Claim(ctx, g.db, req.Ref, req.Fingerprint, req.Owner, g.lease)
	case !c.res.Claimed:
		return g.store.ClaimHeld(ctx, g.db, req.Ref, req.Fingerprint, req.Owner, g.lease)
	}
	return c.res, nil
}

// send sends the waiting claims (the sender's own first among them) as one
// batch, answers them, and hands the claims that arrived meanwhile to one
// of their executions. The hand-off happens even if the batch panics.
func (g *Group) send(ctx context.Context) {
	g.mu.Lock()
	n := min(len(g.queue), maxClaimBatch)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	g.mu.Unlock()
	self := batch[0] // the sender's own claim: it was first in the queue

	defer func() {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.sending = false
			g.mu.Unlock()
			return
		}
		next := g.queue[0]
		g.mu.Unlock()
		next.next <- true
	}()
	answered := false
	defer func() {
		if !answered { // the batch panicked before answering: its claims are sent alone
			for _, c := range batch[1:] {
				c.err = errClaimBatchPanicked
				c.next <- false
			}
			self.err = errClaimBatchPanicked
		}
	}()

	g.sizes.Observe(float64(len(batch)))
	reqs := make([]outbox.ClaimRequest, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	results, err := g.store.ClaimNew(ctx, g.db, reqs, g.lease, claimLockTimeout)
	if err != nil {
		g.failed.Inc()
	}
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = results[i]
		}
	}
	answered = true // every call has its answer: waking them cannot panic
	for _, c := range batch[1:] {
		c.next <- false
	}
}
