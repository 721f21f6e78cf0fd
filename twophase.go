package onceonly

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/lease"
	"github.com/onceonly/onceonly/internal/pgretry"
	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/outbox"
)

// twoPhase is the mode of an engine with Config.TwoPhase or Config.DB, of
// DoTx and DoSQLTx, and of a one-commit execution promoted by its first
// Step: the claim commits on its own (in progress, with its lease and
// owner), the engine renews the lease while the handler runs, and the key's
// completion commits with the handler's writes, fenced by the owner. The
// default mode is singleCommit (single.go).
type twoPhase struct{ e *Engine }

func (m twoPhase) check(ctx context.Context, ref keystate.Ref, fp string, owner keystate.Owner) (Outcome, string, bool, error) {
	return m.e.checkCache(ctx, ref, fp, owner)
}

// claim claims x's key in Postgres. A key another execution holds is read
// into Redis (read-repair); should Redis not take it, this request's
// provisional claim is dropped, as it would answer 409 for a whole lease.
func (m twoPhase) claim(ctx context.Context, x *Execution) (keystate.Key, bool, error) {
	e := m.e
	x.claimedAt = time.Now()
	claim, err := e.claim(ctx, x.ref, x.fingerprint, x.fence.Owner)
	if err != nil {
		e.releaseCache(ctx, x.ref, x.fence.Owner)
		return keystate.Key{}, false, e.fromClaim(err)
	}
	if !claim.Claimed {
		if !e.applyCache(ctx, claim.Key) {
			e.releaseCache(ctx, x.ref, x.fence.Owner)
		}
		return claim.Key, false, nil
	}
	x.fence = Fence{Owner: claim.Key.Owner, Version: claim.Key.Version}
	if claim.TookOver {
		x.by = byTakeover
	}
	if err := x.loadSteps(claim.Steps); err != nil {
		e.log.Error("resume from recorded steps: calling them again", "scope", x.ref.Scope, "key", x.ref.Key, "err", err)
	}
	return claim.Key, true, nil
}

func (m twoPhase) hold(ctx context.Context, x *Execution, onLost func()) *lease.Lease {
	return m.e.leases.Hold(ctx, x.ref, x.fence.Owner, x.claimedAt, onLost)
}

func (twoPhase) tx(x *Execution) (pgx.Tx, error) { return x.transaction(), nil }

// sqlTx begins the execution's transaction on Config.DB and hands x to the
// sqlTwoPhase mode.
func (m twoPhase) sqlTx(ctx context.Context, x *Execution) (*sql.Tx, error) {
	return m.e.beginSQL(ctx, x)
}

// complete sends the key's completion, fenced by the owner, and the COMMIT
// in one round trip.
func (m twoPhase) complete(ctx context.Context, x *Execution, res Result) (keystate.Key, bool, error) {
	return x.commitWith(ctx, func(b *pgx.Batch, stored *keystate.Key) {
		m.e.store.QueueComplete(b, x.ref, x.fence.Owner, keystate.Response(res), stored)
	})
}

func (m twoPhase) release(ctx context.Context, x *Execution, end ending) (keystate.Key, bool, error) {
	e := m.e
	k, err := pgretry.OnLiveConnection(ctx, e.cfg.Pool, func() (keystate.Key, error) {
		if end == endHandOff {
			return e.store.HandOff(ctx, e.cfg.Pool, x.ref, x.fence.Owner)
		}
		return e.store.Fail(ctx, e.cfg.Pool, x.ref, x.fence.Owner, end == endHandlerFailed)
	})
	if err != nil {
		return keystate.Key{}, false, fromStore(err)
	}
	return k, true, nil
}

func (twoPhase) keepsRow() bool      { return true }
func (twoPhase) callerCommits() bool { return false }

// claim claims ref in Postgres. The claim is not canceled with ctx: a
// claim canceled in flight may still commit, and its caller, not knowing,
// would strand the key for a whole lease; execute finds ctx ended after
// the claim and gives the key back instead. A claim that met a dead pooled
// connection (Postgres restarted) is tried once more.
func (e *Engine) claim(ctx context.Context, ref keystate.Ref, fp string, owner keystate.Owner) (claim outbox.ClaimResult, err error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.LeaseTimeout)
	defer cancel()
	cctx, span := e.startSpan(cctx, spanClaim)
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attrClaimed.Bool(claim.Claimed), attrVersion.Int64(claim.Key.Version))
		}
		endSpan(span, err)
	}()
	return pgretry.OnLiveConnection(ctx, e.cfg.Pool, func() (outbox.ClaimResult, error) {
		if e.claims != nil {
			return e.claims.Claim(cctx, outbox.ClaimRequest{Ref: ref, Fingerprint: fp, Owner: owner})
		}
		return e.store.Claim(cctx, e.cfg.Pool, ref, fp, owner, e.cfg.LeaseTimeout)
	})
}
