package onceonly_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// BenchmarkFirstExecution measures a first execution with the business
// insert alone, and with one step before it (its intent a durable commit,
// its outcome an asynchronous one), in the default mode (one commit until
// the first step) and with Config.TwoPhase, side by side on the same
// database:
//
//	go test -run '^$' -bench FirstExecution -benchtime 2000x -count 3 .
func BenchmarkFirstExecution(b *testing.B) {
	ctx := oncetest.Context(b)
	pool := oncetest.DB(b)
	for _, mode := range []struct {
		name     string
		twoPhase bool
	}{{"default", false}, {"twophase", true}} {
		b.Run(mode.name, func(b *testing.B) {
			e, err := onceonly.New(onceonly.Config{Pool: pool, LeaseTimeout: 30 * time.Second, TwoPhase: mode.twoPhase, Logger: oncetest.QuietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			benchmarkFirstExecution(ctx, b, e)
		})
	}
}

func benchmarkFirstExecution(ctx context.Context, b *testing.B, e *onceonly.Engine) {
	insert := func(ctx context.Context, x *onceonly.Execution, charge string) (onceonly.Result, error) {
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status, charge_id)
			VALUES ($1, $2, $3, 1, 'usd', 'c', 'succeeded', $4)`, x.Scope()+"/"+x.Key(), x.Scope(), x.Key(), charge)
		return onceonly.Result{Status: 201}, err
	}
	if err := e.Register("plain", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		return insert(ctx, x, "")
	}); err != nil {
		b.Fatal(err)
	}
	if err := e.Register("step", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		charge, err := onceonly.Step(ctx, "charge", func(_ context.Context, key string) (string, error) { return "ch_" + key[3:12], nil })
		if err != nil {
			return onceonly.Result{}, err
		}
		return insert(ctx, x, charge)
	}); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"plain", "step"} {
		b.Run(name, func(b *testing.B) {
			run := oncetest.RandomSuffix(8)
			b.ResetTimer()
			for i := range b.N {
				if _, err := e.Run(ctx, name, "bench", run+"-"+strconv.Itoa(i), []byte(`{}`)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
