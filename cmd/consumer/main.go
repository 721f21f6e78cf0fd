// Command consumer is the demo's message consumer (docs/consumer.md): it
// makes each payment command a broker carries happen once, as
// POST /v1/payments does for HTTP — the same validation, gateway calls and
// payments rows (package payments' Payer), in the same key space (the
// merchant is the scope).
//
//	consumer                         consume until SIGTERM, serving /healthz, /readyz, /metrics
//	consumer publish KEY MESSAGE     publish a payment message (the tour, scripts)
//
// BROKER_URL picks the broker: amqp://user:pass@host:port/vhost (RabbitMQ,
// package onceamqp: quorum queue payments.charge, dead letters moved at
// least once through exchange payments.dead into quorum queue
// payments.charge.dead) or
// nats://host:port (NATS JetStream, package oncenats: stream PAYMENTS on
// payments.charge and payments.dead, durable pull consumer payments),
// kafka://host:port[,host:port…] (Kafka, package oncekafka: topic
// payments.charge, dead letters on topic payments.charge.dead, group
// payments) or sqs://host:port?region=R (SQS, package oncesqs: queue
// payments-charge, dead letters sent to queue payments-charge-dead;
// sqs://?region=R is AWS's endpoint, credentials from AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY).
// The consumer declares that topology at start and whenever it connects
// again, and reconnects by itself.
//
// Beside its consumers it runs the engine's resumer, which finishes a
// payment whose process died after the gateway was called. The relay and
// the reconciler are commands of their own (cmd/relay, cmd/reconciler), as
// for the api: run them beside it.
package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/paygateway"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const synopsis = `usage: consumer [flags]                        consume payment messages from BROKER_URL
       consumer publish [flags] KEY MESSAGE      publish MESSAGE (a payment command's JSON) with
                                                 idempotency key KEY on BROKER_URL, and exit`

// settings is the consumer's configuration.
type settings struct {
	*daemon.Common
	engine      *daemon.Engine
	gateway     *paygateway.Settings
	brokerURL   *string
	maxFailures *int
	workers     *int
	copies      *int
}

// Defaults of the consumer's own settings.
const (
	defaultWorkers = 8
	// shutdownTimeout bounds how long a stop waits for the executions under
	// way before canceling them, within the 10 s a command has after
	// SIGTERM (the in-process gateway's stop takes up to 2 s more).
	shutdownTimeout = 6 * time.Second
)

func define(s *config.Set) *settings {
	return &settings{
		Common:      daemon.DefineCommon(s, ":8084", "Redis URL, redis:// or rediss://; unset with no cluster or Sentinel URL: Postgres only"),
		engine:      daemon.DefineEngine(s, "consumer"),
		gateway:     paygateway.Define(s),
		brokerURL:   s.String("broker-url", "BROKER_URL", "", "the broker (required): amqp://user:pass@host:port/vhost (RabbitMQ), nats://host:port (NATS JetStream), kafka://host:port (Kafka) or sqs://host:port?region=R (SQS)"),
		maxFailures: s.Int("max-failures", "CONSUMER_MAX_FAILURES", onceonly.DefaultMaxFailures, "executions of a key that may end failed (tok_gatewayError) before its message is dead-lettered, reason failed"),
		workers:     s.Int("workers", "CONSUMER_WORKERS", defaultWorkers, "messages handled at once"),
		copies:      s.FlagSet().Int("copies", 1, "publish: how many times to publish the message"),
	}
}

// newSet returns the consumer's settings on a fresh set whose -h prints
// the synopsis and every flag to out.
func newSet(out io.Writer) (*config.Set, *settings) {
	set := config.NewSet("consumer", out)
	set.SetSynopsis(synopsis)
	return set, define(set)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "publish" {
		return runPublish(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "help" {
		set, _ := newSet(stdout)
		_ = set.Parse([]string{"-h"})
		return 0
	}
	return runServe(args, stderr)
}

// validate checks what needs more than a flag parse; the error is one
// line.
func (s *settings) validate() (brokerKind, error) {
	kind, err := parseBrokerURL(*s.brokerURL)
	if err != nil {
		return 0, err
	}
	if err := s.engine.Validate(); err != nil {
		return 0, err
	}
	return kind, s.gateway.Validate()
}

// fail prints a one-line error after the command's name and returns code.
func fail(stderr io.Writer, command string, err error, code int) int {
	fmt.Fprintf(stderr, "%s: %v\n", command, err)
	return code
}
