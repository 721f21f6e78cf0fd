package oncewatermill

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
)

// execution is one message's way through the engine: the handler it runs
// when it holds the key, and what that run returned.
type execution struct {
	msg  *message.Message
	next message.HandlerFunc
	// joined is true when the key's statements ran in the subscriber's
	// transaction.
	joined bool
	// ran is true once the handler ran; out is what it returned, err its
	// error (a panic included).
	ran bool
	out []*message.Message
	err error
}

// pgxHandler is the onceonly.Handler of Do and DoTx.
func (x *execution) pgxHandler(ctx context.Context, _ pgx.Tx) (onceonly.Result, error) {
	return x.run(ctx)
}

// sqlHandler is the onceonly.SQLHandler of DoSQLTx.
func (x *execution) sqlHandler(ctx context.Context, _ *sql.Tx) (onceonly.Result, error) {
	return x.run(ctx)
}

// run runs the handler with the execution's context as the message's, so
// that onceonly.Tx(msg.Context()) (or onceonly.SQLTx) returns the
// transaction that commits with the key, and stores the messages it
// returns in the Result. A panic fails the execution like an error: it
// is the handler's, and the message is retried (and dead-lettered after
// SettlePolicy.MaxFailures) rather than crash the router's goroutine.
//
//nolint:contextcheck,nolintlint // ctx reaches the handler, in the message: Watermill passes a handler its context there (contextcheck reads this on the callee; nolintlint cannot see that use).
func (x *execution) run(ctx context.Context) (res onceonly.Result, err error) {
	orig := x.msg.Context()
	x.msg.SetContext(ctx)
	defer func() {
		x.msg.SetContext(orig)
		if p := recover(); p != nil {
			err = fmt.Errorf("oncewatermill: the handler panicked: %v", p)
		}
		x.ran, x.err = true, err
	}()
	out, err := x.next(x.msg)
	if err != nil {
		return onceonly.Result{}, err
	}
	if res, err = encodeProduced(out); err != nil {
		return onceonly.Result{}, err
	}
	x.out = out
	return res, nil
}

// produced returns the messages to publish for an acknowledged message:
// those the handler returned in this run, else those the key's first
// execution stored (a replay).
func (x *execution) produced(out onceonly.Outcome) ([]*message.Message, error) {
	if x != nil && x.ran && !out.Replayed {
		return x.out, nil
	}
	return decodeProduced(out.Result)
}
