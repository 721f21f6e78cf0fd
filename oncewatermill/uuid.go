package oncewatermill

import (
	"context"
	"strconv"

	"github.com/google/uuid"

	"github.com/onceonly/onceonly"
)

// producedNamespace is the UUID namespace of ProducedUUID.
var producedNamespace = uuid.MustParse("622aee5c-4a7e-4360-852d-94f3eafdf695")

// ProducedUUID returns the UUID for the n-th message (from 0) that the
// handler running in ctx produces: a name-based UUID (version 5) of the
// execution's scope, key and n alone, so every run of the key derives the
// same one. A replay returns the stored messages with their UUIDs anyway;
// this matters where a run's messages may be published and the run then
// rolled back and run again: in watermill-sql's transaction (see the
// package comment), the router publishes before the commit. It returns
// onceonly.ErrNoExecution outside a handler the middleware runs.
func ProducedUUID(ctx context.Context, n int) (string, error) {
	x, ok := onceonly.ExecutionOf(ctx)
	if !ok {
		return "", onceonly.ErrNoExecution
	}
	name := x.Scope() + "\x00" + x.Key() + "\x00" + strconv.Itoa(n)
	return uuid.NewSHA1(producedNamespace, []byte(name)).String(), nil
}
