package reconcile

import (
	"context"
	"encoding/json"
	"time"

	"github.com/onceonly/onceonly/outbox"
)

// recordTimeout bounds the write of a pass's record: a pass that ended
// because its context did still gets recorded, and a Postgres that does
// not answer does not hold the next pass up.
const recordTimeout = 5 * time.Second

// remember records a pass that ran (finished or failed) in the table
// reconcile_passes, where the operators' console reads the last ones. A dry
// run changes nothing, so it is not recorded either. A pass that cannot be
// recorded (Postgres is what failed it, most likely) is logged; the pass
// itself stands.
func (r *Reconciler) remember(ctx context.Context, result string, rep Report, took time.Duration, passErr error) {
	if rep.DryRun {
		return
	}
	report, err := json.Marshal(rep)
	if err == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		defer cancel()
		err = r.store.RecordPass(rctx, r.cfg.Pool, outbox.Pass{
			Result: result, Report: report, Err: passErr, Duration: took,
		})
	}
	if err != nil {
		r.log.Warn("reconcile pass not recorded in reconcile_passes", "err", err)
	}
}
