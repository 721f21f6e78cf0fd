package main

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

const (
	testLease       = 3 * time.Second
	testSlowDelay   = 1500 * time.Millisecond
	testMaxFailures = 2
	// settleWithin bounds every wait for messages to settle: the lease, a
	// redelivery after AckWait (the lease) and the gateway's delay, with
	// room for a loaded machine.
	settleWithin = 30 * time.Second
)

// TestConsumer runs the consumer binary on each broker through every
// outcome docs/consumer.md describes. The binary is built once; the brokers
// run side by side (they wait on leases and redeliveries more than they
// compute), each broker's subtests one after the other (the topology's
// names are fixed).
func TestConsumer(t *testing.T) {
	t.Parallel()
	bin := oncetest.BuildBinary(t, ".")
	for _, b := range []testBroker{&natsBroker{addr: oncetest.NATSURL(t)}, &amqpBroker{addr: oncetest.AMQPURL(t)}} {
		t.Run(b.name(), func(t *testing.T) {
			t.Parallel()
			t.Run("Outcomes", func(t *testing.T) { testOutcomes(t, bin, b) })
			t.Run("FailedThenDeadLettered", func(t *testing.T) { testFailed(t, bin, b) })
			t.Run("InFlightCopy", func(t *testing.T) { testInFlight(t, bin, b) })
			t.Run("KilledMidPayment", func(t *testing.T) { testKilled(t, bin, b) })
			t.Run("GracefulShutdown", func(t *testing.T) { testShutdown(t, bin, b) })
			t.Run("Reconnects", func(t *testing.T) {
				rb := b
				if _, ok := b.(*natsBroker); ok {
					srv := oncetest.NewNATSServer(t) // restarted: not the shared one
					rb = &natsBroker{addr: srv.URL(), private: srv}
				}
				testReconnects(t, bin, rb)
			})
		})
	}
}

// bundle is one test's consumer and what it checks with.
type bundle struct {
	broker testBroker
	dbURL  string
	pool   *pgxpool.Pool
	env    []string
}

// setup resets the broker's topology and returns the environment of a
// consumer on a database and Redis prefix of the test's own, with the
// in-process gateway.
func setup(t *testing.T, b testBroker) *bundle {
	t.Helper()
	b.reset(t)
	dbURL := oncetest.DatabaseURL(t)
	_, prefix := oncetest.Redis(t)
	env := []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + oncetest.RedisURL(t), "REDIS_PREFIX=" + prefix,
		"BROKER_URL=" + b.url(), "LEASE_TIMEOUT=" + testLease.String(), "RESUME_INTERVAL=300ms",
		"SLOW_GATEWAY_DELAY=" + testSlowDelay.String(), fmt.Sprintf("CONSUMER_MAX_FAILURES=%d", testMaxFailures)}
	return &bundle{broker: b, dbURL: dbURL, pool: oncetest.Pool(t, dbURL), env: env}
}

// rows counts the payment rows of (merchant, key) by status.
func (b *bundle) rows(t *testing.T, merchant, key string) map[string]int {
	t.Helper()
	out := map[string]int{}
	rows, err := b.pool.Query(oncetest.Context(t), `SELECT status, count(*) FROM payments WHERE merchant_id = $1 AND idempotency_key = $2 GROUP BY 1`, merchant, key)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var status string
		var n int
		require.NoError(t, rows.Scan(&status, &n))
		out[status] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// charges counts the gateway's final charges for (merchant, key) and
// checks the payment row carries the charge's id when there is one.
func (b *bundle) charges(t *testing.T, merchant, key string) int {
	t.Helper()
	var n int
	var mismatched int
	require.NoError(t, b.pool.QueryRow(oncetest.Context(t), `SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
			SELECT 1 FROM payments p WHERE p.merchant_id = $1 AND p.idempotency_key = $2 AND p.charge_id = c.charge_id))
		FROM gateway.charges c WHERE reference = $1 || '/' || $2 AND status <> 'processing'`, merchant, key).Scan(&n, &mismatched))
	require.Zero(t, mismatched, "%s/%s: a charge without its payment row", merchant, key)
	return n
}

// keyRow reports whether (merchant, key) has a row in idempotency_keys,
// with its status and failures.
func (b *bundle) keyRow(t *testing.T, merchant, key string) (status string, failures int, ok bool) {
	t.Helper()
	err := b.pool.QueryRow(oncetest.Context(t), `SELECT status, failures FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		merchant, key).Scan(&status, &failures)
	if err != nil {
		return "", 0, false
	}
	return status, failures, true
}

// awaitDeadLetters waits until the dead letters are want (in any order).
func (b *bundle) awaitDeadLetters(t *testing.T, d *oncetest.Daemon, want ...deadLetter) {
	t.Helper()
	var got []deadLetter
	oncetest.Eventually(t, settleWithin, fmt.Sprintf("dead letters %v", want), func() bool {
		got = b.broker.deadLetters(t, d.Logs.String())
		if len(got) < len(want) {
			return false
		}
		// On RabbitMQ the reason is read from the consumer's log line,
		// which may land just after the broker dead-lettered the message.
		for _, dl := range got {
			if dl.reason == "" {
				return false
			}
		}
		return true
	})
	require.ElementsMatch(t, want, got, d.Logs.String())
}

// awaitRow waits until (merchant, key) has a payment row.
func (b *bundle) awaitRow(t *testing.T, merchant, key string) {
	t.Helper()
	oncetest.Eventually(t, settleWithin, "a payment row for "+key, func() bool { return len(b.rows(t, merchant, key)) > 0 })
}

// stopAndCheckEmpty waits until payments.charge is empty (a redelivery
// after a broker restart is acked as a replay), stops the consumer with
// SIGTERM (exit 0 within 10 s) and checks nothing came back: RabbitMQ
// requeues what a closed channel left unacknowledged.
func (b *bundle) stopAndCheckEmpty(t *testing.T, d *oncetest.Daemon) {
	t.Helper()
	oncetest.Eventually(t, settleWithin, "payments.charge empty", func() bool { return b.broker.left(t) == 0 })
	stop(t, d)
	require.Zero(t, b.broker.left(t), "messages left in payments.charge")
}

// stop sends SIGTERM and requires exit 0 within 10 s.
func stop(t *testing.T, d *oncetest.Daemon) time.Duration {
	t.Helper()
	began := time.Now()
	require.NoError(t, d.Cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- d.Cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit 0 after SIGTERM:\n%s", d.Logs.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit within 10 s of SIGTERM:\n%s", d.Logs.String())
	}
	return time.Since(began)
}

// testOutcomes: one row per key for tok_visa and tok_chargeDeclined,
// whatever the copies (sent at once, later, in another member order);
// every copy acked; the key with another body dead-lettered as reused;
// bad JSON, no key, a bad key, a bad merchant and a bad field
// dead-lettered as invalid with no key row; nothing left in the queue.
func testOutcomes(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	d := oncetest.StartDaemon(t, bin, tb.env...)
	visa := message("acct_a", "tok_visa", 1000)
	reordered := `{"source":"tok_visa", "currency":"usd","amount":1000,"customer":"cus_1","merchant":"acct_a"}`
	for range 3 {
		b.publish(t, "visa-1", visa)
	}
	b.publish(t, "declined-1", message("acct_a", "tok_chargeDeclined", 700))
	b.publish(t, "declined-1", message("acct_a", "tok_chargeDeclined", 700))
	// Another merchant's key of the same name is another payment.
	b.publish(t, "visa-1", message("acct_b", "tok_visa", 1000))
	tb.awaitRow(t, "acct_a", "visa-1")
	tb.awaitRow(t, "acct_a", "declined-1")
	tb.awaitRow(t, "acct_b", "visa-1")
	b.publish(t, "visa-1", reordered) // a later copy: the same payload
	b.publish(t, "visa-1", message("acct_a", "tok_visa", 2000))
	for key, body := range map[string]string{
		"bad-json": `{"merchant":"acct_a",`, "bad-merchant": message("acct:a", "tok_visa", 1),
		"bad-amount": message("acct_a", "tok_visa", 0), "bad key": visa, "": visa,
	} {
		b.publish(t, key, body)
	}
	tb.awaitDeadLetters(t, d, deadLetter{"visa-1", "reused"}, deadLetter{"bad-json", "invalid"}, deadLetter{"bad-merchant", "invalid"},
		deadLetter{"bad-amount", "invalid"}, deadLetter{"bad key", "invalid"}, deadLetter{"", "invalid"})
	oncetest.Eventually(t, settleWithin, "every copy acked", func() bool { return settled(t, b, d, "ack", "") == 7 })

	require.Equal(t, map[string]int{"succeeded": 1}, tb.rows(t, "acct_a", "visa-1"))
	require.Equal(t, map[string]int{"declined": 1}, tb.rows(t, "acct_a", "declined-1"))
	require.Equal(t, map[string]int{"succeeded": 1}, tb.rows(t, "acct_b", "visa-1"))
	for _, k := range [][2]string{{"acct_a", "visa-1"}, {"acct_a", "declined-1"}, {"acct_b", "visa-1"}} {
		require.Equal(t, 1, tb.charges(t, k[0], k[1]), "%v charged once", k)
		status, _, ok := tb.keyRow(t, k[0], k[1])
		require.True(t, ok)
		require.Equal(t, "completed", status)
	}
	require.Equal(t, 3, settled(t, b, d, "ack", "executed"))
	require.Equal(t, 4, settled(t, b, d, "ack", "replayed"), "the copies are acked as replays")
	require.Equal(t, 1, settled(t, b, d, "dead_letter", "reused"))
	require.Equal(t, 5, settled(t, b, d, "dead_letter", "invalid"))
	var keys int
	require.NoError(t, tb.pool.QueryRow(oncetest.Context(t), `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
	require.Equal(t, 3, keys, "an invalid message claims no key")
	tb.stopAndCheckEmpty(t, d)
}

// testFailed: tok_gatewayError fails its key and the message comes again;
// after CONSUMER_MAX_FAILURES failed executions it is dead-lettered as
// failed, with no row and no charge; a later copy runs again (once more).
func testFailed(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	d := oncetest.StartDaemon(t, bin, tb.env...)
	body := message("acct_a", "tok_gatewayError", 900)
	b.publish(t, "gw-1", body)
	tb.awaitDeadLetters(t, d, deadLetter{"gw-1", "failed"})
	status, failures, ok := tb.keyRow(t, "acct_a", "gw-1")
	require.True(t, ok)
	require.Equal(t, "failed", status)
	require.Equal(t, testMaxFailures, failures, "dead-lettered after CONSUMER_MAX_FAILURES failed executions")
	require.Equal(t, testMaxFailures-1, settled(t, b, d, "retry", "failed"), "redelivered after each failure but the last")
	require.Zero(t, settled(t, b, d, "retry", "handed_off"), "a gateway that charged nothing fails the key, no hand-off")

	b.publish(t, "gw-1", body) // a later copy runs again
	tb.awaitDeadLetters(t, d, deadLetter{"gw-1", "failed"}, deadLetter{"gw-1", "failed"})
	_, failures, _ = tb.keyRow(t, "acct_a", "gw-1")
	require.Equal(t, testMaxFailures+1, failures, "the later copy ran once more")
	require.Empty(t, tb.rows(t, "acct_a", "gw-1"))
	require.Zero(t, tb.charges(t, "acct_a", "gw-1"))
	tb.stopAndCheckEmpty(t, d)
}

// testInFlight: copies of a slow payment delivered while its execution
// runs are redelivered (never dead-lettered) and acked once it commits.
func testInFlight(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	d := oncetest.StartDaemon(t, bin, tb.env...)
	body := message("acct_a", "tok_slow", 1200)
	for range 3 {
		b.publish(t, "slow-1", body)
	}
	oncetest.Eventually(t, settleWithin, "three copies acked", func() bool { return settled(t, b, d, "ack", "") == 3 })
	require.Positive(t, settled(t, b, d, "retry", "in_flight"), "a copy met the execution in flight")
	require.Zero(t, settled(t, b, d, "dead_letter", ""), "never dead-lettered for that")
	require.Equal(t, map[string]int{"succeeded": 1}, tb.rows(t, "acct_a", "slow-1"))
	require.Equal(t, 1, tb.charges(t, "acct_a", "slow-1"))
	tb.stopAndCheckEmpty(t, d)
}

// testKilled (a crash blocks a key for one lease at most; nothing is left
// half done): a consumer killed with SIGKILL while its slow charge is at
// the gateway leaves the message unacknowledged; another consumer gets it
// again (RabbitMQ at once, NATS after AckWait) and the payment is made
// once: one row, one charge, the message acked, none dead-lettered.
func testKilled(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	victim := oncetest.StartDaemon(t, bin, tb.env...)
	b.publish(t, "slow-k", message("acct_a", "tok_slow", 1300))
	oncetest.Eventually(t, settleWithin, "the slow charge in flight at the gateway", func() bool {
		var n int
		err := tb.pool.QueryRow(oncetest.Context(t), `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_a/slow-k'`).Scan(&n)
		return err == nil && n == 1
	})
	require.NoError(t, victim.Cmd.Process.Kill())
	_ = victim.Cmd.Wait()
	killed := time.Now()
	survivor := oncetest.StartDaemon(t, bin, tb.env...)
	tb.awaitRow(t, "acct_a", "slow-k")
	oncetest.Eventually(t, settleWithin, "the message acked", func() bool { return settled(t, b, survivor, "ack", "") == 1 })
	t.Logf("%s: payment made %s after the kill", b.name(), time.Since(killed).Round(10*time.Millisecond))
	require.Equal(t, map[string]int{"succeeded": 1}, tb.rows(t, "acct_a", "slow-k"))
	require.Equal(t, 1, tb.charges(t, "acct_a", "slow-k"))
	require.Zero(t, settled(t, b, survivor, "dead_letter", ""))
	tb.stopAndCheckEmpty(t, survivor)
}

// testShutdown: SIGTERM while a slow payment runs lets it finish and
// settle; the process exits 0 within 10 s with nothing left in the queue.
func testShutdown(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	d := oncetest.StartDaemon(t, bin, tb.env...)
	b.publish(t, "slow-s", message("acct_a", "tok_slow", 1400))
	oncetest.AwaitClaimed(t, oncetest.Context(t), tb.pool, "slow-s")
	took := stop(t, d)
	t.Logf("%s: exited %s after SIGTERM", b.name(), took.Round(10*time.Millisecond))
	require.Equal(t, map[string]int{"succeeded": 1}, tb.rows(t, "acct_a", "slow-s"), "the execution under way finished")
	status, _, _ := tb.keyRow(t, "acct_a", "slow-s")
	require.Equal(t, "completed", status)
	require.Zero(t, b.left(t), "its message was acked before the exit")
	require.Contains(t, d.Logs.String(), "shutting down")
}

// testReconnects: the broker drops the consumer's connection (RabbitMQ
// closes it; NATS restarts); the consumer is unready meanwhile, then
// consumes again by itself, without exiting.
func testReconnects(t *testing.T, bin string, b testBroker) {
	tb := setup(t, b)
	d := oncetest.StartDaemon(t, bin, tb.env...)
	b.publish(t, "before", message("acct_a", "tok_visa", 10))
	tb.awaitRow(t, "acct_a", "before")
	b.dropConnections(t)
	oncetest.WaitReady(t, d.Addr) // consuming again
	b.publish(t, "after", message("acct_a", "tok_visa", 11))
	tb.awaitRow(t, "acct_a", "after")
	require.NoError(t, d.Cmd.Process.Signal(syscall.Signal(0)), "the consumer did not exit")
	logs := d.Logs.String()
	require.True(t, slices.ContainsFunc([]string{"reconnect", "lost the broker", "consuming failed"}, func(s string) bool {
		return strings.Contains(logs, s)
	}), "the consumer noticed the loss:\n%s", logs)
	tb.stopAndCheckEmpty(t, d)
}
