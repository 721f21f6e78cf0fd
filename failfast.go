package onceonly

// The checks that turn a misuse into an error that names its fix, where it
// would otherwise be a nil-pointer panic on the first request or message.

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/onceonly/onceonly/internal/schemaver"
)

// schemaError makes an error of the engine's that Postgres's "relation
// (or function) does not exist" about one of the engine's own tables or
// functions caused an ErrSchemaBehind too, which names the fix. A
// handler's error (*ExecutionError) stays as it is.
func schemaError(err error) error {
	if err == nil || errors.Is(err, ErrSchemaBehind) || !schemaver.MissingObject(err) {
		return err
	}
	if _, ok := errors.AsType[*ExecutionError](err); ok {
		return err
	}
	return fmt.Errorf("%w: %w", ErrSchemaBehind, err)
}

// ErrNotMade is returned by the Engine's methods on a nil or zero Engine
// (var e onceonly.Engine, &onceonly.Engine{}): only New makes one.
var ErrNotMade = errors.New("onceonly: the Engine was not made by onceonly.New (a nil or zero Engine): use engine, err := onceonly.New(onceonly.Config{Pool: pool})")

// errNoHandler is returned by Do, DoTx, DoSQL and DoSQLTx without a handler.
var errNoHandler = errors.New("onceonly: the handler is nil")

// errNoTx is returned by DoTx and DoSQLTx without the caller's transaction.
var errNoTx = errors.New("onceonly: DoTx and DoSQLTx need the caller's transaction (nil given)")

// made returns ErrNotMade unless New made e.
func (e *Engine) made() error {
	if e == nil || e.store == nil {
		return ErrNotMade
	}
	return nil
}

// canDo checks the engine and the handler of a Do (fnNil: the handler is
// nil).
func (e *Engine) canDo(fnNil bool) error {
	if err := e.made(); err != nil {
		return err
	}
	if fnNil {
		return errNoHandler
	}
	return nil
}

// errNilRedis is New's error for a Config.Redis that holds a nil client.
var errNilRedis = errors.New("onceonly: Config.Redis holds a nil client (a nil *redis.Client in the interface): " +
	"leave Config.Redis unset to run without Redis")

// nilInterface reports whether v is a non-nil interface holding a nil
// pointer: the engine would call through it on the first request.
func nilInterface(v any) bool {
	if v == nil {
		return false
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// errNoScope is the panic of Middleware without MiddlewareOptions.Scope.
const errNoScope = "onceonly: MiddlewareOptions.Scope is required: a func(r *http.Request) (string, error) returning the request's tenant " +
	"(merchant, user) whose keys must never meet another's, e.g. the account of its API key; " +
	"a service with one tenant returns a constant"
