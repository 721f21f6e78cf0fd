package main

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/oncetest"
)

// TestMain gives the example DATABASE_URL and REDIS_URL of its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "sqlexample"))
}

func Example() {
	if err := run(context.Background(), os.Stdout); err != nil {
		panic(err)
	}
	// Output:
	// shipping order 1
	// msg-1: status=201 replayed=false
	// msg-1: status=201 replayed=true
	// shipping order 2
	// msg-2: status=201 replayed=false
	// msg-2: status=201 replayed=true
	// shipments: 2
}
