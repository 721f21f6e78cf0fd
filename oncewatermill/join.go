package oncewatermill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
)

// heldTx is the transaction a subscriber handed the handler: pgx's or
// database/sql's, or none.
type heldTx struct {
	pgx pgx.Tx
	sql *sql.Tx
}

// subscriberTx returns the transaction watermill-sql's subscriber
// consumes the message in (watermill-sql's TxFromContext): it commits
// the consumer group's offset (or the queue row's deletion) when the
// message is acked, and rolls back when the subscriber gives it up. A
// transaction of a kind the engine cannot join is an error: the handler
// may write through it, and those writes would commit apart from the key.
func subscriberTx(ctx context.Context) (heldTx, error) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok || tx == nil {
		return heldTx{}, nil
	}
	switch t := tx.(type) {
	case *wsql.PgxTx:
		return heldTx{pgx: t.Tx}, nil
	case wsql.PgxTx:
		return heldTx{pgx: t.Tx}, nil
	case *wsql.StdSQLTx:
		return heldTx{sql: t.Tx}, nil
	case wsql.StdSQLTx:
		return heldTx{sql: t.Tx}, nil
	}
	return heldTx{}, fmt.Errorf("oncewatermill: the subscriber's transaction is a %T, which the engine cannot join (watermill-sql's BeginnerFromPgx and BeginnerFromStdSQL give ones it can); set Options.NoJoin and write through onceonly.Tx", tx)
}

// serializationFailure reports whether err is Postgres's
// serialization_failure (40001) or deadlock_detected (40P01), from any
// driver: pgx's PgError and lib/pq's Error both tell their SQLSTATE.
func serializationFailure(err error) bool {
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return false
	}
	code := coded.SQLState()
	return code == "40001" || code == "40P01"
}

// maxCounted bounds the keys failureCounts remembers.
const maxCounted = 4096

// failureCounts counts the failed executions of keys in this process, for
// the failures the engine does not count (see middleware.settlementOf).
// At most limit keys are remembered; past that it forgets them all, so
// counting starts again: a message is then dead-lettered later than
// MaxFailures, never sooner.
type failureCounts struct {
	mu    sync.Mutex
	limit int
	n     map[string]int
}

func newFailureCounts(limit int) *failureCounts {
	return &failureCounts{limit: limit, n: make(map[string]int)}
}

// add counts one more failure of (scope, key) and returns the count.
func (c *failureCounts) add(scope, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := scope + ":" + key // a scope holds no ':'
	if _, ok := c.n[k]; !ok && len(c.n) >= c.limit {
		clear(c.n)
	}
	c.n[k]++
	return c.n[k]
}

// forget drops the count of (scope, key).
func (c *failureCounts) forget(scope, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.n, scope+":"+key)
}
