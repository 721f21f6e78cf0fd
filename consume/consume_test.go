package consume_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
	"github.com/onceonly/onceonly/oncetest"
)

// message stands for a broker's message type.
type message struct {
	key, scope, body string
}

func identifier() consume.Identifier[*message] {
	return consume.Identifier[*message]{
		Scope: "tenant",
		Key: func(m *message) (string, error) {
			if m.key == "" {
				return "", errors.New("no key")
			}
			return m.key, nil
		},
		Body: func(m *message) []byte { return []byte(m.body) },
	}
}

func TestIdentify(t *testing.T) {
	t.Parallel()
	id, err := identifier().Identify(&message{key: "k1", body: "b"})
	require.NoError(t, err)
	require.Equal(t, consume.Identity{Scope: "tenant", Key: "k1", Payload: []byte("b")}, id)

	scoped := identifier()
	scoped.ScopeOf = func(m *message) (string, error) { return m.scope, nil }
	scoped.Payload = func(m *message) ([]byte, error) { return []byte("p:" + m.body), nil }
	id, err = scoped.Identify(&message{key: "k1", scope: "s", body: "b"})
	require.NoError(t, err)
	require.Equal(t, consume.Identity{Scope: "s", Key: "k1", Payload: []byte("p:b")}, id)

	_, err = identifier().Identify(&message{})
	require.ErrorIs(t, err, onceonly.ErrInvalidMessage, "no key")
	_, err = identifier().Identify(&message{key: "with space"})
	require.ErrorIs(t, err, onceonly.ErrInvalidKey)

	for what, broken := range map[string]func(i *consume.Identifier[*message]){
		"scope": func(i *consume.Identifier[*message]) {
			i.ScopeOf = func(*message) (string, error) { return "", errors.New("no scope") }
		},
		"payload": func(i *consume.Identifier[*message]) {
			i.Payload = func(*message) ([]byte, error) { return nil, errors.New("bad json") }
		},
	} {
		i := identifier()
		broken(&i)
		_, err := i.Identify(&message{key: "k1"})
		require.ErrorIs(t, err, onceonly.ErrInvalidMessage, what)
		require.Contains(t, err.Error(), what+": ")
	}

	// A panic in Key is an invalid message, not a crash.
	panicky := identifier()
	panicky.Key = func(*message) (string, error) { panic("boom") }
	_, err = panicky.Identify(&message{})
	require.ErrorIs(t, err, onceonly.ErrInvalidMessage)
	p, ok := errors.AsType[*consume.PanicError](err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "boom", p.Value)
}

func TestInvalidWrapsOnce(t *testing.T) {
	t.Parallel()
	err := consume.Invalid("key", fmt.Errorf("%w: no header", onceonly.ErrInvalidMessage))
	require.ErrorIs(t, err, onceonly.ErrInvalidMessage)
	require.Equal(t, "key: onceonly: invalid message: no header", err.Error())
	require.Equal(t, "onceonly: invalid message: key: eof", consume.Invalid("key", errors.New("eof")).Error())
}

func TestCheckScope(t *testing.T) {
	t.Parallel()
	i := identifier()
	require.NoError(t, i.CheckScope())
	i.Scope = "a:b"
	require.ErrorIs(t, i.CheckScope(), onceonly.ErrInvalidScope)
	i.ScopeOf = func(m *message) (string, error) { return m.scope, nil }
	require.NoError(t, i.CheckScope(), "ScopeOf takes the scope from each message")
}

func TestReason(t *testing.T) {
	t.Parallel()
	require.Equal(t, consume.ReasonExecuted, consume.Reason(onceonly.Settlement{Disposition: onceonly.Ack}))
	require.Equal(t, consume.ReasonReplayed, consume.Reason(onceonly.Settlement{Disposition: onceonly.Ack, Outcome: onceonly.Outcome{Replayed: true}}))
	require.Equal(t, onceonly.ReasonReused, consume.Reason(onceonly.Settlement{Disposition: onceonly.DeadLetter, Reason: onceonly.ReasonReused}))
	require.Equal(t, consume.ReasonFailed, consume.Reason(onceonly.Settlement{Disposition: onceonly.Retry, Err: &onceonly.ExecutionError{Err: errors.New("x")}}))
	require.Equal(t, consume.ReasonHandedOff, consume.Reason(onceonly.Settlement{Disposition: onceonly.Retry, Err: &onceonly.ExecutionError{HandedOff: true}}))
	require.Equal(t, consume.ReasonError, consume.Reason(onceonly.Settlement{Disposition: onceonly.Retry, Err: errors.New("store down")}))
}

// engine returns an engine on a database of the test's own and the test
// Redis.
func engine(t *testing.T) *onceonly.Engine {
	t.Helper()
	rdb, prefix := oncetest.Redis(t)
	e, err := onceonly.New(onceonly.Config{
		Pool: oncetest.DB(t), Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 3 * time.Second, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

func config(e *onceonly.Engine) consume.Config[*message] {
	return consume.Config[*message]{
		Package: "test", Engine: e, Identifier: identifier(), Logger: oncetest.QuietLogger(),
		Policy: onceonly.SettlePolicy{MaxFailures: 2, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
		Attrs:  func(m *message) []any { return []any{"key", m.key} },
	}
}

// A registered handler runs once per key with the message it came with:
// acked as executed, then as replayed; a panic fails the execution
// (retried, then dead-lettered at MaxFailures); an invalid message never
// reaches the handler.
func TestExecutorRun(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	e := engine(t)
	var runs []string
	x, err := consume.New(config(e), "test.run", consume.Work[*message]{Handler: func(_ context.Context, id consume.Identity, m *message) error {
		require.NotNil(t, m, "the message reaches the handler through Engine.Run")
		runs = append(runs, id.Key+"="+string(id.Payload))
		if m.body == "panic" {
			panic("handler bug")
		}
		return nil
	}})
	require.NoError(t, err)

	s := x.Settle(ctx, &message{key: "k1", body: "a"})
	require.Equal(t, onceonly.Ack, s.Disposition, "%v", s.Err)
	require.Equal(t, consume.ReasonExecuted, consume.Reason(s))
	s = x.Settle(ctx, &message{key: "k1", body: "a"})
	require.Equal(t, consume.ReasonReplayed, consume.Reason(s))
	require.Equal(t, []string{"k1=a"}, runs)

	s = x.Settle(ctx, &message{key: "k2", body: "panic"})
	require.Equal(t, onceonly.Retry, s.Disposition)
	require.Equal(t, consume.ReasonFailed, consume.Reason(s))
	require.ErrorContains(t, s.Err, "test: handler panicked: handler bug")

	s = x.Settle(ctx, &message{body: "no key"})
	require.Equal(t, onceonly.DeadLetter, s.Disposition)
	require.Equal(t, onceonly.ReasonInvalid, s.Reason)
	require.Len(t, runs, 2, "an invalid message never runs")

	_, err = consume.New(config(e), "test.run", consume.Work[*message]{Handler: func(context.Context, consume.Identity, *message) error { return nil }})
	require.Error(t, err, "a name is registered once")
}

// A TxHandler runs in the key's transaction: its error rolls its writes
// back with the key's failure; a panic is a failure too.
func TestExecutorTx(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	e := engine(t)
	x, err := consume.New(config(e), "", consume.Work[*message]{Tx: func(ctx context.Context, tx pgx.Tx, _ consume.Identity, m *message) error {
		switch m.body {
		case "panic":
			panic("tx bug")
		case "fail":
			return errors.New("refused")
		}
		var one int
		return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
	}})
	require.NoError(t, err)
	s := x.Settle(ctx, &message{key: "k1", body: "ok"})
	require.Equal(t, onceonly.Ack, s.Disposition, "%v", s.Err)
	require.Equal(t, consume.ReasonReplayed, consume.Reason(x.Settle(ctx, &message{key: "k1", body: "ok"})))

	s = x.Settle(ctx, &message{key: "k2", body: "fail"})
	require.Equal(t, onceonly.Retry, s.Disposition)
	require.ErrorContains(t, s.Err, "refused")
	s = x.Settle(ctx, &message{key: "k3", body: "panic"})
	require.Equal(t, onceonly.Retry, s.Disposition)
	require.ErrorContains(t, s.Err, "test: handler panicked: tx bug")
}

// Fatal picks out the errors no message can get past: a missing schema
// (here, a database never migrated, New's check skipped) and an Engine
// New did not make.
func TestFatal(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	e, err := onceonly.New(onceonly.Config{
		Pool: oncetest.Pool(t, oncetest.EmptyDatabaseURL(t)), Logger: oncetest.QuietLogger(),
		Tuning: onceonly.Tuning{NoSchemaCheck: true},
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	x, err := consume.New(config(e), "", consume.Work[*message]{Tx: func(context.Context, pgx.Tx, consume.Identity, *message) error { return nil }})
	require.NoError(t, err)
	s := x.Settle(ctx, &message{key: "k1", body: "a"})
	require.ErrorIs(t, consume.Fatal(s), onceonly.ErrSchemaBehind)
	require.Equal(t, onceonly.Retry, s.Disposition)

	x, err = consume.New(config(&onceonly.Engine{}), "", consume.Work[*message]{Tx: func(context.Context, pgx.Tx, consume.Identity, *message) error { return nil }})
	require.NoError(t, err)
	require.ErrorIs(t, consume.Fatal(x.Settle(ctx, &message{key: "k1"})), onceonly.ErrNotMade)

	require.NoError(t, consume.Fatal(onceonly.Settlement{Disposition: onceonly.Retry, Err: onceonly.ErrUnavailable}))
	require.NoError(t, consume.Fatal(onceonly.Settlement{Disposition: onceonly.Ack}))
}
