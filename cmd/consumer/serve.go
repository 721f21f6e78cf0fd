package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cache"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/ops"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
	"github.com/onceonly/onceonly/demo/payments"
	"github.com/onceonly/onceonly/demo/payments/schema"
)

// runServe is `consumer [flags]`: everything is validated before the first
// log line or connection.
func runServe(args []string, stderr io.Writer) int {
	set, s := newSet(stderr)
	if code, ok := daemon.ParseArgs(set, "consumer", args, stderr); !ok {
		return code
	}
	if err := set.Require(map[string]*string{"broker-url": s.brokerURL}); err != nil {
		return fail(stderr, "consumer", err, 2)
	}
	setup, err := s.Validate(stderr, set, false)
	var kind brokerKind
	if err == nil {
		kind, err = s.validate()
	}
	if err != nil {
		return fail(stderr, "consumer", err, 2)
	}
	ctx, stop := shutdown.SignalContext()
	defer stop()
	stopTracing, err := tracing.Start(ctx, "onceonly-consumer")
	if err != nil {
		return fail(stderr, "consumer", err, 2)
	}
	defer stopTracing()
	if err := serve(ctx, s, kind, setup); err != nil {
		return fail(stderr, "consumer", err, 1)
	}
	return 0
}

// serve connects Postgres, Redis, the gateway and the broker, and consumes
// beside the ops server until ctx ends.
func serve(ctx context.Context, s *settings, kind brokerKind, setup daemon.Setup) error {
	log := setup.Log
	if setup.Redis == nil {
		log.Warn("REDIS_URL is unset: running from Postgres alone")
	}
	rt, err := daemon.OpenRuntime(ctx, setup, s.Common, s.engine, daemon.RuntimeOptions{
		// Each worker's execution holds a connection at a time; the claim
		// batches, the resumer and the in-process gateway want a few more.
		MinConns: int32(min(2**s.workers+8, 256)), //nolint:gosec // G115: bounded above
		Schema:   schema.Migrations(),
		// The resumer only: the relay and the reconciler run as commands of
		// their own (cmd/relay, cmd/reconciler), as beside the api.
		Configure: func(cfg *onceonly.Config) { cfg.Daemons = onceonly.Daemons{NoRelay: true, NoReconciler: true} },
	})
	if err != nil {
		return err
	}
	defer rt.Close()
	pool, rdb, reg, engine := rt.Pool, rt.Redis, rt.Registry, rt.Engine
	gw, stopGateway, err := s.gateway.Open(ctx, pool, *s.engine.LeaseTimeout, log)
	if err != nil {
		return err
	}
	defer stopGateway()

	cc := consumerConfig{
		url: *s.brokerURL, engine: engine, payer: &payments.Payer{Gateway: gw},
		maxFailures: *s.maxFailures, workers: *s.workers, lease: *s.engine.LeaseTimeout,
		log: log, registerer: reg,
	}
	newConsumer, brokerName := newAMQPConsumer, "rabbitmq"
	switch kind {
	case natsJetStream:
		newConsumer, brokerName = newNATSConsumer, "nats"
	case kafka:
		newConsumer, brokerName = newKafkaConsumer, "kafka"
	case amazonSQS:
		newConsumer, brokerName = newSQSConsumer, "sqs"
	case rabbitMQ:
	}
	cons, closeBroker, err := newConsumer(cc)
	if err != nil {
		return err
	}
	defer closeBroker()
	if err := engine.Start(ctx); err != nil {
		return err
	}

	// Ready: consuming on a live connection, and Postgres answers. Without
	// Redis the consumer still works, from Postgres: degraded, not unready.
	var optional map[string]ops.Check
	if rdb != nil {
		optional = map[string]ops.Check{"redis": cache.ReadyCheck(rdb)}
	}
	mux := http.NewServeMux()
	ops.Handle(mux, reg, map[string]ops.Check{"postgres": pool.Ping, "broker": connected(cons)}, optional)
	srv := &http.Server{Addr: *s.HTTPAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("consumer started", "addr", *s.HTTPAddr, "broker", brokerName, "workers", *s.workers,
		"max_failures", *s.maxFailures, "redis", rdb != nil, "gateway", gw.BaseURL)
	return shutdown.RunBeside(ctx, srv, log, cons.Run)
}

// errNotConsuming is /readyz's answer while the consumer has no live
// connection to the broker.
var errNotConsuming = errors.New("not consuming: no live connection to the broker")

func connected(c consumer) ops.Check {
	return func(context.Context) error {
		if !c.Connected() {
			return errNotConsuming
		}
		return nil
	}
}
