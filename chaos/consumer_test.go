package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/oncetest"
)

// The consumer chaos test (issue 25): the demo consumer, two processes of
// it, on each broker, with the relay, the reconciler and the gateway (its
// faults on), as real binaries on a private Postgres, Redis and broker.
// Payment messages are published 1–3 times (copies at once and late),
// some with a key reused for another body, some invalid, while consumers
// are killed (SIGKILL), Redis is flushed and the broker restarts once. At
// the end: exactly one payment row and at most one charge per message id,
// the reused and invalid ones dead-lettered with no row of their own,
// tok_gatewayError ones dead-lettered as failed with no row and no charge,
// nothing left in the queue, nothing lost.
//
// CHAOS_MESSAGES (default 300) sets the number of logical messages per
// broker, CHAOS_CONSUMER_DURATION (default: 20 ms per message, at least
// 15 s) the time their publications are spread over. By default it runs on
// NATS and RabbitMQ; CHAOS_BROKER names the brokers to run on instead,
// comma-separated: nats, rabbitmq, kafka (a kfake process) or sqs (goaws
// behind its JSON front) — the last two only when named (`make
// chaos-consumer BROKER=kafka`), not in `make test`. On SQS the broker's
// restart is an outage of the endpoint: goaws keeps nothing across a
// restart of its own.
const (
	ccMaxFailures = 3
	// ccSettleLimit bounds the wait, after the load, for every message to
	// settle. docs/consumer.md promises no figure; this is the test's
	// budget: a copy a killed consumer held comes back once the broker's
	// deadline runs out (on NATS the AckWait, the lesser of 30 s and
	// LEASE_TIMEOUT: docs/consumer.md#topology) and finds the key free once
	// its lease is over, so LEASE_TIMEOUT + 30 s of its last publication,
	// plus 30 s for the broker's redelivery delay after a restart.
	ccSettleLimit = leaseTimeout + 60*time.Second
	// ccKafkaRebalance is added to it on Kafka: the load's last kill may
	// leave the group rebalancing, waiting for the killed member up to the
	// rebalance timeout (kgo's default, 60 s) before its partitions move
	// on; nothing of theirs settles meanwhile. Three 2,000-message runs
	// on kfake settled in 30 s, 97 s and more than ccSettleLimit (62 s).
	ccKafkaRebalance = 60 * time.Second
	// ccGatewayFaults are the gateway's faults, rarer than TestChaos's: a
	// message whose charge is lost to one is finished by the engine
	// (nothing is left half done).
	ccGatewayFaults = "charge_then_500=0.03,charge_then_hang=0.02,charge_then_reset=0.03,fail_before_charge=0.03"
)

// ConsumerSummary is what a consumer chaos run writes to the chaos
// summary. A failed run writes what it measured before it stopped.
type ConsumerSummary struct {
	Failed  bool   `json:"failed"`
	Reached string `json:"reached"` // setup, load, settle, checks or done
	// DurationS is the load's length; SettleS the time from its end until
	// every message was settled.
	DurationS float64 `json:"duration_s"`
	SettleS   float64 `json:"settle_s"`
	// Messages counts the logical messages, by kind in Kinds; Published
	// the copies the broker confirmed, PublishRetries the publications
	// tried again after an error (each may have added a copy).
	Messages       int            `json:"messages"`
	Kinds          map[string]int `json:"kinds"`
	Published      int            `json:"published"`
	PublishRetries int            `json:"publish_retries"`
	// PaymentRows and Charges are counted at the end; DeadLetters by
	// reason.
	PaymentRows    int            `json:"payment_rows"`
	Charges        int            `json:"charges"`
	DeadLetters    map[string]int `json:"dead_letters"`
	DoublePayments int            `json:"double_payments"`
	DoubleCharges  int            `json:"double_charges"`
	Lost           int            `json:"lost"`
	// DuplicateDeadLetters are dead letters beyond the copies published:
	// RabbitMQ's quorum queue moves a dead letter at least once, and on
	// Kafka and SQS a consumer killed between sending a dead letter and
	// settling the message sends it again, so one may arrive twice (the
	// NATS stream drops a copy published again, by its Nats-Msg-Id, and
	// stays strict).
	DuplicateDeadLetters int            `json:"duplicate_dead_letters"`
	Faults               map[string]int `json:"faults"`
	// BrokerRestartS is how long the broker's restart took (stopped,
	// started and answering).
	BrokerRestartS float64  `json:"broker_restart_s"`
	Violations     []string `json:"violations"`
}

// ccKinds picks a message's kind by its number: half tok_visa, the rest
// declined, slow, failing at the gateway, reusing their key, invalid.
var ccKinds = []string{"visa", "visa", "visa", "visa", "visa", "visa", "visa", "visa", "visa",
	"declined", "declined", "slow", "slow", "gateway_error", "reused", "reused", "invalid", "invalid", "invalid", "invalid"}

// ccMessage is one logical message of the load: its key, merchant, kind,
// body, and the copies published of each body (a reused key has two).
type ccMessage struct {
	key, merchant, kind string
	bodies              []string // [0] the message; [1] the reused key's other body
	mu                  sync.Mutex
	confirmed, maybe    []int // per body: copies the broker confirmed; publications whose outcome is unknown
}

func (m *ccMessage) published(body int, confirmed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if confirmed {
		m.confirmed[body]++
	} else {
		m.maybe[body]++
	}
}

func TestChaosConsumer(t *testing.T) {
	messages := envInt("CHAOS_MESSAGES", 300)
	duration, err := time.ParseDuration(os.Getenv("CHAOS_CONSUMER_DURATION"))
	if err != nil || duration <= 0 {
		duration = max(15*time.Second, time.Duration(messages)*20*time.Millisecond)
	}
	bins := buildCommands(t)
	summaries := map[string]any{}
	brokers := []string{"nats", "rabbitmq"}
	if only := os.Getenv("CHAOS_BROKER"); only != "" {
		brokers = strings.Split(only, ",")
	}
	for _, broker := range brokers {
		if !slices.Contains([]string{"nats", "rabbitmq", "kafka", "sqs"}, broker) {
			t.Fatalf("CHAOS_BROKER=%s: say nats, rabbitmq, kafka or sqs (comma-separated)", os.Getenv("CHAOS_BROKER"))
		}
		s := &ConsumerSummary{Reached: "setup", Messages: messages, Kinds: map[string]int{}, DeadLetters: map[string]int{},
			Faults: map[string]int{}, Violations: []string{}}
		summaries["consumer_"+broker] = s
		ok := t.Run(broker, func(t *testing.T) { runConsumerChaos(t, bins, broker, duration, messages, s) })
		s.Failed = !ok
	}
	writeSummary(t, summaries)
}

// ccRun is one consumer chaos run's stack.
type ccRun struct {
	t         *testing.T
	s         *ConsumerSummary
	broker    chaosBroker
	pool      *pgxpool.Pool
	redis     *redis.Client
	consumers []*proc
	all       []*proc
}

func (r *ccRun) violatef(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.s.Violations = append(r.s.Violations, msg)
	r.t.Error(msg)
}

func runConsumerChaos(t *testing.T, bins, broker string, duration time.Duration, messages int, s *ConsumerSummary) {
	ctx := oncetest.ContextFor(t, loadTimeout(t, duration))
	pg := oncetest.NewPostgresServer(t)
	rds := oncetest.NewRedisServer(t)
	r := &ccRun{t: t, s: s, redis: rds.Client(t)}
	switch broker {
	case "nats":
		r.broker = newNATSChaos(t)
	case "kafka":
		r.broker = newKafkaChaos(t)
	case "sqs":
		r.broker = newSQSChaos(t)
	default:
		r.broker = newAMQPChaos(t)
	}
	defer r.broker.close()
	env := []string{"DATABASE_URL=" + pg.URL(), "REDIS_URL=" + rds.URL(), "LOG_LEVEL=warn"}
	if _, err := runOnce(ctx, bins+"/api", env, "migrate", "up"); err != nil {
		t.Fatal(err)
	}
	gw := newProc(t, "gateway", bins+"/gateway", oncetest.FreeAddr(t), "DATABASE_URL="+pg.URL(), "LOG_LEVEL=warn",
		"SLOW_GATEWAY_DELAY=300ms", "GATEWAY_FAULTS="+ccGatewayFaults, "GATEWAY_HANG="+gatewayHang.String())
	consumerEnv := append([]string{"BROKER_URL=" + r.broker.url(), "LEASE_TIMEOUT=" + leaseTimeout.String(),
		"RESUME_INTERVAL=" + resumeInterval.String(), "GATEWAY_URL=http://" + gw.addr, "GATEWAY_TIMEOUT=" + gatewayTimeout.String(),
		fmt.Sprintf("CONSUMER_MAX_FAILURES=%d", ccMaxFailures)}, env...)
	r.consumers = []*proc{
		newProc(t, "consumer1", bins+"/consumer", oncetest.FreeAddr(t), consumerEnv...),
		newProc(t, "consumer2", bins+"/consumer", oncetest.FreeAddr(t), consumerEnv...),
	}
	relay := newProc(t, "relay", bins+"/relay", oncetest.FreeAddr(t), append(env, "RELAY_POLL_INTERVAL=200ms", "DATABASE_SESSION_URL="+pg.URL())...)
	reconciler := newProc(t, "reconciler", bins+"/reconciler", oncetest.FreeAddr(t),
		append(env, "RECONCILE_SCHEDULE=@every "+reconcileInterval.String(), "REAP_GRACE="+reapGrace.String())...)
	r.all = append([]*proc{gw, relay, reconciler}, r.consumers...)
	for _, p := range r.all {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, p := range r.all {
			p.kill()
		}
		if t.Failed() {
			for _, p := range r.all {
				t.Logf("--- %s log tail:\n%s", p.name, p.tail())
			}
		}
	})
	// The consumers declare the topology: publish once one consumes.
	if !settle(30*time.Second, func() bool { return r.consumers[0].ready() && r.consumers[1].ready() }) {
		t.Fatalf("the consumers are not ready:\n%s\n%s", r.consumers[0].tail(), r.consumers[1].tail())
	}
	r.pool = oncetest.Pool(t, pg.URL())

	s.Reached = "load"
	plan := ccPlan(messages, s)
	loadCtx, endLoad := context.WithCancel(ctx)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		r.injectFaults(loadCtx, duration)
	}()
	began := time.Now()
	r.publishAll(ctx, plan, duration)
	endLoad()
	<-faultsDone
	s.DurationS = time.Since(began).Seconds()
	if ctx.Err() != nil {
		r.violatef("the load outlasted its deadline: %v", context.Cause(ctx))
	}

	s.Reached = "settle"
	ctx = oncetest.ContextFor(t, checksTimeout(t, duration))
	settledAt := time.Now()
	var left, deadN int
	settleLimit := ccSettleLimit
	if broker == "kafka" {
		settleLimit += ccKafkaRebalance
	}
	if !settle(settleLimit, func() bool {
		var done bool
		left, deadN, done = r.settled(ctx, plan)
		return done
	}) {
		r.violatef("not every message settled within %s of the load's end (%d left in the queue, %d dead letters)", settleLimit, left, deadN)
	}
	s.SettleS = time.Since(settledAt).Seconds()

	s.Reached = "checks"
	for _, c := range r.consumers {
		if err := c.stop(); err != nil { // SIGTERM: exit 0 within 10 s
			r.violatef("%v", err)
		}
	}
	if n, err := r.broker.pending(ctx); err != nil || n != 0 {
		r.violatef("%d messages left in payments.charge once the consumers stopped (err %v)", n, err)
	}
	dead, err := r.broker.deadLetters(ctx, r.consumerLogs())
	if err != nil {
		r.violatef("read the dead letters: %v", err)
	}
	r.check(ctx, plan, dead)
	for _, p := range []*proc{relay, reconciler, gw} {
		if err := p.stop(); err != nil {
			r.violatef("%v", err)
		}
	}
	if s.Faults["kill_consumer"] == 0 || s.Faults["flush_redis"] == 0 || s.Faults["restart_broker"] != 1 {
		t.Errorf("the run injected too few faults: %v", s.Faults)
	}
	s.Reached = "done"
}

// ready reports whether the process's /readyz answers 200.
func (p *proc) ready() bool {
	res, err := p.get("/readyz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// ccPlan makes the load's messages.
func ccPlan(n int, s *ConsumerSummary) []*ccMessage {
	plan := make([]*ccMessage, n)
	for i := range plan {
		m := &ccMessage{key: fmt.Sprintf("msg-%d", i), merchant: fmt.Sprintf("acct_c%d", i%3), kind: ccKinds[i%len(ccKinds)]}
		body := func(source string, amount int) string {
			return fmt.Sprintf(`{"merchant":%q,"amount":%d,"currency":"eur","customer":"cus_%d","source":%q}`, m.merchant, amount, i, source)
		}
		switch m.kind {
		case "visa", "reused":
			m.bodies = []string{body("tok_visa", 100+i)}
		case "declined":
			m.bodies = []string{body("tok_chargeDeclined", 100+i)}
		case "slow":
			m.bodies = []string{body("tok_slow", 100+i)}
		case "gateway_error":
			m.bodies = []string{body("tok_gatewayError", 100+i)}
		case "invalid":
			switch i / len(ccKinds) % 4 {
			case 0:
				m.bodies = []string{`{"merchant":"` + m.merchant + `","amount":`} // bad JSON
			case 1:
				m.bodies = []string{strings.Replace(body("tok_visa", 100+i), m.merchant, "acct:bad", 1)}
			case 2:
				m.bodies = []string{body("tok_visa", 0)} // amount out of range
			case 3:
				m.key = "" // no key at all
				m.bodies = []string{body("tok_visa", 100+i)}
			}
		}
		if m.kind == "reused" {
			m.bodies = append(m.bodies, body("tok_visa", 100000+i))
		}
		m.confirmed, m.maybe = make([]int, len(m.bodies)), make([]int, len(m.bodies))
		s.Kinds[m.kind]++
		plan[i] = m
	}
	return plan
}

// publishAll publishes every message's copies at their places in the
// load's schedule: 1–3 copies, the first at a random time within the first
// four fifths of duration, each further one at once (a concurrent copy) or
// up to 3 s later (a late one); a reused key's other body once, up to 3 s
// after the first. A publication that fails is tried again until the
// broker confirms it.
func (r *ccRun) publishAll(ctx context.Context, plan []*ccMessage, duration time.Duration) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var mu sync.Mutex
	for _, m := range plan {
		start := time.Duration(rand.Int64N(int64(duration * 4 / 5)))
		type copyAt struct {
			body int
			at   time.Duration
		}
		copies := []copyAt{{0, start}}
		for range rand.IntN(3) {
			at := start
			if rand.IntN(2) == 0 {
				at += time.Duration(rand.IntN(3000)) * time.Millisecond
			}
			copies = append(copies, copyAt{0, at})
		}
		if len(m.bodies) > 1 {
			copies = append(copies, copyAt{1, start + time.Duration(rand.IntN(3000))*time.Millisecond})
		}
		for _, c := range copies {
			wg.Go(func() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(c.at): // the copy's place in the schedule
				}
				sem <- struct{}{}
				defer func() { <-sem }()
				for ctx.Err() == nil {
					err := r.broker.publish(ctx, m.key, m.bodies[c.body])
					m.published(c.body, err == nil)
					mu.Lock()
					if err == nil {
						r.s.Published++
					} else {
						r.s.PublishRetries++
					}
					mu.Unlock()
					if err == nil {
						return
					}
					time.Sleep(200 * time.Millisecond) // the publisher's pace while the broker is away
				}
			})
		}
	}
	wg.Wait()
}

// injectFaults kills a random consumer (SIGKILL, back 200 ms later), then
// flushes Redis, then kills one again, and again, every 0.8–2 s until ctx
// ends, and restarts the broker once, near the middle: a kill and a flush
// come first, so that a short run has each fault whatever the restart
// takes.
func (r *ccRun) injectFaults(ctx context.Context, duration time.Duration) {
	restartAt := time.Now().Add(duration * 2 / 5)
	restarted, n := false, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(800+rand.IntN(1200)) * time.Millisecond):
		}
		if !restarted && time.Now().After(restartAt) {
			restarted = true
			began := time.Now()
			r.broker.restart()
			r.s.BrokerRestartS = time.Since(began).Seconds()
			r.s.Faults["restart_broker"]++
			continue
		}
		n++
		if n%3 != 2 { // a kill, a flush, a kill, …: one of each comes before the broker restart
			c := r.consumers[rand.IntN(len(r.consumers))]
			c.kill()
			time.Sleep(200 * time.Millisecond) // the time the process stays down
			if err := c.start(); err != nil {
				r.violatef("%v", err)
			}
			r.s.Faults["kill_consumer"]++
			continue
		}
		if r.redis.FlushAll(ctx).Err() == nil {
			r.s.Faults["flush_redis"]++
		}
	}
}

// settled reports whether every message has settled: its payment row
// (tok_visa, declined, slow, and a reused key's winner), or as many dead
// letters as copies confirmed (invalid, tok_gatewayError, a reused key's
// loser), and nothing is left in the queue.
func (r *ccRun) settled(ctx context.Context, plan []*ccMessage) (left, dead int, done bool) {
	left, err := r.broker.pending(ctx)
	if err != nil || left != 0 {
		return left, 0, false
	}
	if dead, err = r.deadCount(ctx); err != nil {
		return 0, 0, false
	}
	rows, err := r.rows(ctx)
	if err != nil {
		return 0, dead, false
	}
	var wantDead int
	for _, m := range plan {
		switch m.kind {
		case "visa", "declined", "slow", "reused":
			if len(rows[m.merchant+"/"+m.key]) == 0 {
				return 0, dead, false
			}
		}
		switch m.kind {
		case "invalid", "gateway_error":
			wantDead += m.confirmed[0]
		case "reused":
			wantDead += min(m.confirmed[0], m.confirmed[1]) // the loser's, at least
		}
	}
	return 0, dead, dead >= wantDead
}

// deadCount counts the dead letters without taking them (RabbitMQ's are
// read off their queue, at the end).
func (r *ccRun) deadCount(ctx context.Context) (int, error) {
	if b, ok := r.broker.(*amqpChaos); ok {
		ch, err := b.channel()
		if err != nil {
			return 0, err
		}
		q, err := ch.QueueDeclarePassive(amqpDeadQueue, true, false, false, false, nil)
		if err != nil {
			b.close()
			return 0, fmt.Errorf("inspect %s: %w", amqpDeadQueue, err)
		}
		return q.Messages, nil
	}
	dead, err := r.broker.deadLetters(ctx, "")
	return len(dead), err
}

// payment is a payment row as the checks read it.
type payment struct {
	status, charge string
	amount         int
}

// rows reads the payment rows by merchant/key.
func (r *ccRun) rows(ctx context.Context) (map[string][]payment, error) {
	rows, err := r.pool.Query(ctx, `SELECT merchant_id || '/' || idempotency_key, status, coalesce(charge_id, ''), amount FROM payments`)
	if err != nil {
		return nil, fmt.Errorf("read the payments: %w", err)
	}
	defer rows.Close()
	out := map[string][]payment{}
	for rows.Next() {
		var ref string
		var p payment
		if err := rows.Scan(&ref, &p.status, &p.charge, &p.amount); err != nil {
			return nil, fmt.Errorf("read the payments: %w", err)
		}
		out[ref] = append(out[ref], p)
	}
	return out, rows.Err()
}

// consumerLogs returns the consumers' logs, every run of them.
func (r *ccRun) consumerLogs() string {
	var b strings.Builder
	for _, c := range r.consumers {
		raw, _ := os.ReadFile(c.logPath)
		b.Write(raw)
	}
	return b.String()
}

// check checks every message's end state, and the engine's: no key left
// in progress, the outbox drained.
func (r *ccRun) check(ctx context.Context, plan []*ccMessage, dead []deadLetter) {
	rows, err := r.rows(ctx)
	if err != nil {
		r.violatef("%v", err)
		return
	}
	charges, err := r.charges(ctx)
	if err != nil {
		r.violatef("%v", err)
		return
	}
	deadBy := map[string][]deadLetter{}
	for _, d := range dead {
		r.s.DeadLetters[d.reason]++
		deadBy[d.key] = append(deadBy[d.key], d)
	}
	for ref, ps := range rows {
		r.s.PaymentRows += len(ps)
		if len(ps) > 1 {
			r.s.DoublePayments++
			r.violatef("the business effect happens once: %s has %d payment rows: %v", ref, len(ps), ps)
		}
	}
	for ref, cs := range charges {
		r.s.Charges += len(cs)
		if len(cs) > 1 {
			r.s.DoubleCharges++
			r.violatef("one external effect: %s was charged %d times: %v", ref, len(cs), cs)
		}
		if ps := rows[ref]; len(ps) != 1 || ps[0].charge != cs[0] {
			r.violatef("nothing is left half done: %s: charge %s has payment rows %v", ref, cs[0], ps)
		}
	}
	var noKey []deadLetter // the messages without a key, together
	noKeyCopies := [2]int{}
	for _, m := range plan {
		ref := m.merchant + "/" + m.key
		ps, ds := rows[ref], deadBy[m.key]
		lost := func(format string, args ...any) {
			r.s.Lost++
			r.violatef("%s (%s): "+format, append([]any{m.key, m.kind}, args...)...)
		}
		switch m.kind {
		case "visa", "declined", "slow":
			want := map[string]string{"visa": "succeeded", "slow": "succeeded", "declined": "declined"}[m.kind]
			if len(ps) == 0 || ps[0].status != want {
				lost("no %s payment row: %v", want, ps)
			}
			if len(ds) > 0 {
				r.violatef("%s (%s) dead-lettered: %v", m.key, m.kind, ds)
			}
		case "reused":
			if len(ps) == 0 {
				lost("no payment row")
				continue
			}
			// The body that made the row won; every copy of the other is
			// dead-lettered, reason reused.
			loser := 1
			if ps[0].amount >= 100000 {
				loser = 0
			}
			r.requireDead(m, ds, "reused", m.confirmed[loser], m.confirmed[loser]+m.maybe[loser], m.bodies[loser])
		case "gateway_error":
			if len(ps) > 0 || len(charges[ref]) > 0 {
				r.violatef("%s (tok_gatewayError) has payment rows %v and charges %v", m.key, ps, charges[ref])
			}
			r.requireDead(m, ds, "failed", m.confirmed[0], m.confirmed[0]+m.maybe[0], m.bodies[0])
		case "invalid":
			if m.key == "" {
				noKeyCopies[0] += m.confirmed[0]
				noKeyCopies[1] += m.confirmed[0] + m.maybe[0]
				continue
			}
			r.requireDead(m, ds, "invalid", m.confirmed[0], m.confirmed[0]+m.maybe[0], m.bodies[0])
		}
	}
	noKey = deadBy[""]
	noKeyCopies[1] = r.allowDuplicates(len(noKey), noKeyCopies[1])
	if len(noKey) < noKeyCopies[0] || len(noKey) > noKeyCopies[1] {
		r.s.Lost += max(0, noKeyCopies[0]-len(noKey))
		r.violatef("messages without a key: %d dead letters for %d–%d copies published", len(noKey), noKeyCopies[0], noKeyCopies[1])
	}
	for _, d := range noKey {
		if d.reason != "invalid" {
			r.violatef("a message without a key dead-lettered as %q", d.reason)
		}
	}
	var keys, inProgress, outbox int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE key LIKE 'msg-%' AND scope LIKE 'acct_c%'),
		count(*) FILTER (WHERE status = 'in_progress') FROM idempotency_keys`).Scan(&keys, &inProgress); err != nil {
		r.violatef("read the keys: %v", err)
	}
	if inProgress > 0 {
		r.violatef("a crash blocks a key for one lease at most: %d keys still in progress after the messages settled", inProgress)
	}
	var outboxErr error
	if !settle(30*time.Second, func() bool {
		outboxErr = r.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&outbox)
		return outboxErr == nil && outbox == 0
	}) {
		r.violatef("no event is lost: the outbox did not drain within 30 s (%d events left, err %v)", outbox, outboxErr)
	}
	var invalidKeys int
	for _, m := range plan {
		if m.kind == "invalid" && m.key != "" {
			var n int
			if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND key = $2`, m.merchant, m.key).Scan(&n); err == nil {
				invalidKeys += n
			}
		}
	}
	if invalidKeys > 0 {
		r.violatef("%d invalid messages claimed a key", invalidKeys)
	}
}

// requireDead checks a message's dead letters: between least and most of
// them, every one with reason and body.
func (r *ccRun) requireDead(m *ccMessage, ds []deadLetter, reason string, least, most int, body string) {
	most = r.allowDuplicates(len(ds), most)
	if len(ds) < least {
		r.s.Lost += least - len(ds)
	}
	if len(ds) < least || len(ds) > most {
		r.violatef("%s (%s): %d dead letters for %d–%d copies: %v", m.key, m.kind, len(ds), least, most, ds)
	}
	for _, d := range ds {
		if d.reason != reason || d.body != body {
			r.violatef("%s (%s): dead letter %q with body %s, want %q with %s", m.key, m.kind, d.reason, d.body, reason, body)
		}
	}
}

// allowDuplicates returns how many dead letters a message may have when
// it has n and its copies allow up to most: on RabbitMQ, Kafka and SQS,
// whose dead letters move at least once, every one past most is counted
// as a duplicate and allowed.
func (r *ccRun) allowDuplicates(n, most int) int {
	if _, strict := r.broker.(*natsChaos); !strict && n > most {
		r.s.DuplicateDeadLetters += n - most
		return n
	}
	return most
}

// charges reads the gateway's final charges by merchant/key.
func (r *ccRun) charges(ctx context.Context) (map[string][]string, error) {
	rows, err := r.pool.Query(ctx, `SELECT reference, charge_id FROM gateway.charges WHERE status <> 'processing' ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("read the charges: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var ref, id string
		if err := rows.Scan(&ref, &id); err != nil {
			return nil, fmt.Errorf("read the charges: %w", err)
		}
		out[ref] = append(out[ref], id)
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out, rows.Err()
}
