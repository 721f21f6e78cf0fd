package outbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// TestSQLTx: the statements a caller's transaction runs (claim, takeover,
// completion) run through database/sql as through pgx, on each driver:
// intervals, uuids, bytea and a missing row read as they do on pgx.
func TestSQLTx(t *testing.T) {
	t.Parallel()
	oncetest.OnEachSQLDriver(t, func(t *testing.T, driver string) {
		b := setup(t)
		url := b.pool.Config().ConnConfig.ConnString()
		db := oncetest.SQLDB(t, driver, url)
		ref := keystate.Ref{Scope: "s", Key: "k"}
		begin := func() outbox.SQLTx {
			tx, err := db.BeginTx(b.ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return outbox.SQLTx{Tx: tx}
		}

		tx := begin()
		res, err := b.store.Claim(b.ctx, tx, ref, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, ownerA, res.Key.Owner)
		require.InDelta(t, float64(time.Minute), float64(res.Key.LeaseRemaining), float64(time.Second), "the lease is an interval, not seconds")
		require.InDelta(t, float64(time.Hour), float64(res.Key.ExpiresIn), float64(time.Second))
		require.NoError(t, tx.Tx.Commit())

		// A takeover: the row is read (claim_peek), then taken.
		b.expireLease(t, b.pool, "k")
		tx = begin()
		res, err = b.store.Claim(b.ctx, tx, ref, "fp", ownerB, time.Minute)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		require.Equal(t, ownerB, res.Key.Owner)
		require.Equal(t, int64(2), res.Key.Version)
		require.NoError(t, tx.Tx.Commit())

		// The owner that lost the key cannot complete it, and its
		// transaction cannot commit.
		tx = begin()
		_, err = b.store.Complete(b.ctx, tx, ref, ownerA, keystate.Response{Status: 201})
		require.ErrorIs(t, err, outbox.ErrLeaseLost)
		require.Error(t, tx.Tx.Commit(), "the failed completion aborted the transaction")

		resp := keystate.Response{Status: 201, ContentType: "application/octet-stream", Body: []byte{0, 1, 0xff},
			Header: map[string][]string{"Location": {"/x"}}}
		tx = begin()
		k, err := b.store.Complete(b.ctx, tx, ref, ownerB, resp)
		require.NoError(t, err)
		require.Equal(t, keystate.Completed, k.Status)
		require.Equal(t, resp.Body, k.Response.Body)
		require.NoError(t, tx.Tx.Commit())
		stored, found, err := b.store.Get(b.ctx, b.pool, ref)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, resp, stored.Response)

		// A replay: the row is read and reported, nothing taken.
		tx = begin()
		res, err = b.store.Claim(b.ctx, tx, ref, "fp", ownerA, time.Minute)
		require.NoError(t, err)
		require.False(t, res.Claimed)
		require.Equal(t, keystate.Completed, res.Key.Status)
		require.Equal(t, resp.Body, res.Key.Response.Body)
		require.NoError(t, tx.Tx.Rollback())
		require.ErrorIs(t, tx.Tx.Rollback(), sql.ErrTxDone)
	})
}
