package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// messagePublishedTwice publishes one payment message twice on the broker
// the running consumer reads (`consumer publish -copies 2`), and shows the
// consumer made one payment of it: one row, one charge, both copies acked
// (one executed, one replayed). Then the same key over HTTP: messages share
// the merchant's key space with the api, so another payload is a reused key.
func (t *tour) messagePublishedTwice(ctx context.Context, consumerBin string) error {
	t.title("a payment message published twice: the consumer pays once")
	if _, err := os.Stat(consumerBin); err != nil {
		fmt.Printf("   skipped: %s not found (make tour builds it): %v\n", consumerBin, err)
		return nil
	}
	if t.databaseURL == "" {
		fmt.Println("   skipped: DATABASE_URL is unset (make tour sets it)")
		return nil
	}
	acked, err := t.consumerAcks(ctx)
	if err != nil {
		return fmt.Errorf("no consumer at %s (make run starts it): %w", t.consumer, err)
	}
	key := t.run + "-message"
	msg := `{"merchant":"acct_demo","amount":2500,"currency":"usd","customer":"cus_tour","source":"tok_visa"}`
	publish := exec.CommandContext(ctx, consumerBin, "publish", "-copies", "2", key, msg)
	publish.Env = append(os.Environ(), "BROKER_URL="+t.brokerURL)
	if out, err := publish.CombinedOutput(); err != nil {
		return fmt.Errorf("consumer publish: %w: %s", err, out)
	}
	fmt.Printf("   published twice on %s, message id %s:\n      %s\n", redactURL(t.brokerURL), key, msg)

	began := time.Now()
	var now map[string]int
	for {
		if now, err = t.consumerAcks(ctx); err == nil && now["executed"]+now["replayed"] >= acked["executed"]+acked["replayed"]+2 {
			break
		}
		if time.Since(began) > 30*time.Second {
			return fmt.Errorf("the consumer did not ack both copies within 30 s (acks before %v, now %v): %w", acked, now, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("   the consumer acked both copies in %s: executed +%d, replayed +%d\n",
		time.Since(began).Round(10*time.Millisecond), now["executed"]-acked["executed"], now["replayed"]-acked["replayed"])

	id, err := t.countPayment(ctx, key)
	if err != nil {
		return err
	}
	if err := t.showPayment(ctx, id); err != nil {
		return err
	}
	r, err := t.once(ctx, t.api, key, body("tok_visa", 2500))
	if err != nil {
		return err
	}
	show("the same key over HTTP", r)
	fmt.Println("   (one key space per merchant: an HTTP request is fingerprinted with its method and path,")
	fmt.Println("    a message by its body alone, so the message's key is refused over HTTP even with this body)")
	return nil
}

// countPayment prints the payments rows the demo merchant has for key and
// the gateway's charges for it, and returns the payment's id; more than one
// row is an error: the key was executed more than once.
func (t *tour) countPayment(ctx context.Context, key string) (string, error) {
	conn, err := pgx.Connect(ctx, t.databaseURL)
	if err != nil {
		return "", fmt.Errorf("connect to Postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var rows, charges int
	var id, status, charge string
	err = conn.QueryRow(ctx, `SELECT count(*) OVER (), id, status, coalesce(charge_id, '') FROM payments
		WHERE merchant_id = 'acct_demo' AND idempotency_key = $1 LIMIT 1`, key).Scan(&rows, &id, &status, &charge)
	if err != nil {
		return "", fmt.Errorf("read the payment: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM gateway.charges WHERE reference = 'acct_demo/' || $1 AND status <> 'processing'`,
		key).Scan(&charges); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		fmt.Printf("   (the gateway's charges are not in this database: %v)\n", err)
	}
	fmt.Printf("   payments rows for the key: %d (%s, %s, charge %s); gateway charges: %d\n", rows, id, status, charge, charges)
	if rows != 1 {
		return "", fmt.Errorf("%d payments rows for key %s: executed more than once", rows, key)
	}
	return id, nil
}

// showPayment prints GET /v1/payments/{id} as the demo merchant.
func (t *tour) showPayment(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.api+"/v1/payments/"+id, nil)
	if err != nil {
		return fmt.Errorf("build the request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+t.apiKey)
	res, err := t.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET the payment: %w", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("read the payment: %w", err)
	}
	fmt.Printf("   GET /v1/payments/%s → %d\n      %s\n", id, res.StatusCode, strings.TrimSpace(string(raw)))
	return nil
}

// consumerAcks reads the consumer's acks by reason (executed, replayed)
// from its /metrics, whichever broker it runs on.
func (t *tour) consumerAcks(ctx context.Context) (map[string]int, error) {
	res, err := t.get(ctx, t.consumer+"/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	acks := map[string]int{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if !consumerMetric(line) || !strings.Contains(line, `disposition="ack"`) {
			continue
		}
		for _, reason := range []string{"executed", "replayed"} {
			if strings.Contains(line, `reason="`+reason+`"`) {
				fields := strings.Fields(line)
				n, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
				acks[reason] += int(n)
			}
		}
	}
	return acks, nil
}

// consumerMetric reports whether a /metrics line is the consumer's count
// of messages by disposition, on any of its brokers.
func consumerMetric(line string) bool {
	for _, name := range []string{"onceonly_nats_messages_total{", "onceonly_amqp_deliveries_total{",
		"onceonly_kafka_records_total{", "onceonly_sqs_messages_total{"} {
		if strings.HasPrefix(line, name) {
			return true
		}
	}
	return false
}

// redactURL hides a URL's password.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the broker"
	}
	return u.Redacted()
}
