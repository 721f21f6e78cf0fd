package onceonly

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/internal/exectx"
	"github.com/onceonly/onceonly/internal/keystate"
	"github.com/onceonly/onceonly/internal/keystore"
)

// single runs fn as a single-commit execution of ref (Config.SingleCommit):
// one round trip begins the transaction, takes the key's advisory lock and
// looks for the key's row; the handler writes; one round trip writes the
// key's row, completed, and commits. handled is false when the key has a
// row: the two-phase path answers it.
func (e *Engine) single(ctx context.Context, ref keystate.Ref, fp string, owner keystate.Owner, request func() []byte, fn Func) (out Outcome, outcome string, handled bool, err error) {
	x := e.newExecution(keystate.Key{Ref: ref, Owner: owner}, "", request)
	x.single, x.fingerprint = true, fp
	startedAt := time.Now()
	var opened keystore.SingleBegin
	x.tx = exectx.New(exectx.Options{Pool: e.cfg.Pool, Unavailable: ErrUnavailable, CommitRefused: ErrCommitByHandler, Prepare: e.store.SetKeepalives, Log: e.log})
	err = x.transaction().BeginWith(ctx, func(b *pgx.Batch) { e.store.QueueSingleBegin(b, ref, e.cfg.LeaseTimeout, &opened) })
	switch {
	case err != nil:
		x.rollback(ctx)
		e.releaseCache(ctx, ref, owner)
		if ctx.Err() != nil {
			return Outcome{}, outcomeUnavailable, true, ctx.Err()
		}
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return Outcome{}, outcomeUnavailable, true, err
	case opened.HasRow:
		x.rollback(ctx)
		return Outcome{}, "", false, nil
	case !opened.Locked:
		x.rollback(ctx)
		return Outcome{}, outcomeInFlight, true, &InFlightError{RetryAfter: time.Second}
	}
	out, outcome, err = e.run(ctx, x, startedAt, fn)
	return out, outcome, true, err
}
