package oncetest

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

//nolint:gosec // G101: RabbitMQ's default guest account, which only loopback clients may use
const howToStartRabbitMQ = `start RabbitMQ: scripts/test.sh does it (TEST_AMQP_PORT, default 61600),
or scripts/services.sh rabbitmq .data/dev 5672 and export TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
and TEST_RABBITMQCTL=$PWD/.data/dev/rabbitmq/rabbitmqctl`

// AMQPURL returns TEST_AMQP_URL, the amqp:// URL of the RabbitMQ the tests
// share, and fails the test when it is not set.
//
// Tests isolate themselves by name, not by virtual host: each declares
// queues and exchanges whose names carry a RandomSuffix of its own and
// deletes them when it ends. A vhost of each test's own would take three
// rabbitmqctl runs (add_vhost, set_permissions, delete_vhost), each an
// Erlang VM boot of about a second, where a name costs nothing; the one
// thing names do not separate, connections, CloseAMQPConnections picks by
// the connection name the client announces.
func AMQPURL(tb testing.TB) string {
	tb.Helper()
	return Env(tb, "TEST_AMQP_URL", "no RabbitMQ for tests", howToStartRabbitMQ)
}

// RabbitMQCtl runs rabbitmqctl against the tests' RabbitMQ node through
// TEST_RABBITMQCTL (the wrapper scripts/services.sh writes beside the node,
// or any command that takes rabbitmqctl's arguments) and returns its
// standard output. It fails the test when the variable is unset or the
// command fails.
func RabbitMQCtl(tb testing.TB, args ...string) string {
	tb.Helper()
	return runRabbitMQCtl(tb, Env(tb, "TEST_RABBITMQCTL", "this test runs rabbitmqctl", howToStartRabbitMQ), args...)
}

// runRabbitMQCtl runs the rabbitmqctl ctl with args and returns its
// standard output; it fails the test when the command fails.
func runRabbitMQCtl(tb testing.TB, ctl string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, ctl, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("%s %s: %v\n%s", ctl, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// CloseAMQPConnections closes, from the broker's side (connection.close
// with CONNECTION_FORCED, as an operator's rabbitmqctl close_connection or a
// node going down sends it), every connection of the tests' RabbitMQ whose
// client announced name as its connection_name, and returns how many it
// closed.
func CloseAMQPConnections(tb testing.TB, name string) int {
	tb.Helper()
	// One line per connection: its pid, a tab, its client properties as an
	// Erlang term, e.g. [{"connection_name","NAME"},{"product",...}].
	out := RabbitMQCtl(tb, "-s", "list_connections", "pid", "client_properties")
	want := fmt.Sprintf(`{"connection_name",%q}`, name)
	closed := 0
	for line := range strings.Lines(out) {
		pid, props, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if !ok || !strings.Contains(props, want) {
			continue
		}
		RabbitMQCtl(tb, "close_connection", pid, "closed by test "+tb.Name())
		closed++
	}
	return closed
}
