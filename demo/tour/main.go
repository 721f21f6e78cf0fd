// Command tour walks through onceonly against a running stack (make run),
// printing what happens at each step: a first call, its replay, a
// concurrent duplicate (409), a reused key (422), a declined card replayed
// (402), a gateway error (502) whose retry runs again, recovery after an
// api process is killed in the middle of a request, an api killed after
// the gateway charged whose payment is finished with no client retry, and a
// payment message published twice that the demo consumer runs once.
//
//	make run     # in one terminal (make run BROKER=rabbitmq: on RabbitMQ)
//	make tour    # in another (make tour BROKER=rabbitmq)
//
// The tour uses no broker client: it publishes through `consumer publish`
// (the consumer's binary, in the commands' module, which holds the broker
// clients), and reads the payment in Postgres and through the api.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/onceonly/onceonly/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tour:", err)
		os.Exit(1)
	}
}

type tour struct {
	api, apiKey string
	gatewayURL  string // the gateway the running api charges through ("": none known)
	consumer    string // the running consumer's ops base URL
	brokerURL   string // the broker it consumes (BROKER_URL)
	databaseURL string // the stack's Postgres, where the payments are
	http        *http.Client
	retrying    *client.Client
	run         string // makes this run's keys unique
	step        int
}

func run() error {
	api := flag.String("api", envOr("TOUR_API", "http://localhost:8080"), "base URL of the running api")
	apiKey := flag.String("api-key", envOr("TOUR_API_KEY", "sk_test_demo"), "API key")
	apiBin := flag.String("api-bin", "bin/api", "api binary, started and killed for the crash steps")
	gatewayBin := flag.String("gateway-bin", "bin/gateway", "gateway binary, started with faults for the charged-then-killed step")
	gatewayURL := flag.String("gateway-url", envOr("TOUR_GATEWAY_URL", ""),
		"the gateway the running api charges through; the crash step's second api charges there too (empty: its own in-process gateway)")
	consumerBin := flag.String("consumer-bin", "bin/consumer", "consumer binary, whose publish command the message step publishes with")
	consumer := flag.String("consumer", envOr("TOUR_CONSUMER", "http://localhost:8084"), "ops base URL of the running consumer")
	brokerURL := flag.String("broker-url", envOr("BROKER_URL", "nats://127.0.0.1:4222"), "the broker the running consumer reads")
	databaseURL := flag.String("database-url", envOr("DATABASE_URL", ""), "the stack's Postgres (the crash and message steps count the payment there)")
	flag.Parse()
	hc := &http.Client{Timeout: 10 * time.Second}
	t := &tour{
		api: strings.TrimSuffix(*api, "/"), apiKey: *apiKey, gatewayURL: *gatewayURL, http: hc,
		consumer: strings.TrimSuffix(*consumer, "/"), brokerURL: *brokerURL, databaseURL: *databaseURL,
		retrying: &client.Client{HTTP: hc, MaxAttempts: 20, MinDelay: 100 * time.Millisecond, MaxDelay: time.Second},
		run:      fmt.Sprintf("tour-%d", time.Now().Unix()),
	}
	ctx := context.Background()
	if err := t.ping(ctx); err != nil {
		return fmt.Errorf("no api at %s (start the stack with `make run`): %w", t.api, err)
	}
	for _, step := range []func(context.Context) error{
		t.firstCallAndReplay, t.concurrentDuplicate, t.reusedKey, t.declinedReplayed, t.gatewayError,
		func(ctx context.Context) error { return t.crashMidRequest(ctx, *apiBin) },
		func(ctx context.Context) error { return t.killedAfterCharge(ctx, *apiBin, *gatewayBin) },
		func(ctx context.Context) error { return t.messagePublishedTwice(ctx, *consumerBin) },
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return t.metrics(ctx)
}

func (t *tour) title(s string) {
	t.step++
	fmt.Printf("\n== %d. %s\n", t.step, s)
}

func body(source string, amount int) []byte {
	return []byte(fmt.Sprintf(`{"amount":%d,"currency":"usd","customer":"cus_tour","source":%q}`, amount, source))
}

func (t *tour) request(key string, b []byte) client.Request {
	return client.Request{Method: "POST", URL: t.api + "/v1/payments", Key: key, Body: b,
		Header: http.Header{"Authorization": {"Bearer " + t.apiKey}}}
}

// once sends one attempt, no retry, and returns its answer, final or
// not (the client's *NotFinalError carries one that is not).
func (t *tour) once(ctx context.Context, base, key string, b []byte) (*client.Response, error) {
	req := t.request(key, b)
	req.URL = base + "/v1/payments"
	res, err := (&client.Client{HTTP: t.http, MaxAttempts: 1}).Do(ctx, req)
	if _, notFinal := errors.AsType[*client.NotFinalError](err); notFinal {
		return res, nil
	}
	return res, err
}

func show(what string, r *client.Response) {
	extra := ""
	if r.Replayed {
		extra = "  Idempotent-Replayed: true"
	}
	if ra := r.Header.Get("Retry-After"); ra != "" {
		extra += "  Retry-After: " + ra
	}
	fmt.Printf("   %-28s → %d after %d attempt(s)%s\n      %s\n", what, r.StatusCode, r.Attempts, extra, strings.TrimSpace(string(r.Body)))
}

func (t *tour) firstCallAndReplay(ctx context.Context) error {
	t.title("a first call, then the same call again")
	key := t.run + "-first"
	first, err := t.retrying.Do(ctx, t.request(key, body("tok_visa", 1000)))
	if err != nil {
		return err
	}
	show("first call", first)
	again, err := t.retrying.Do(ctx, t.request(key, body("tok_visa", 1000)))
	if err != nil {
		return err
	}
	show("same key, same payload", again)
	fmt.Printf("   byte-identical answer: %v; charged once\n", bytes.Equal(first.Body, again.Body))
	return nil
}

func (t *tour) concurrentDuplicate(ctx context.Context) error {
	t.title("a duplicate while the first is still running (tok_slow)")
	key := t.run + "-slow"
	done := make(chan *client.Response, 1)
	go func() {
		r, _ := t.once(ctx, t.api, key, body("tok_slow", 500))
		done <- r
	}()
	time.Sleep(300 * time.Millisecond)
	dup, err := t.once(ctx, t.api, key, body("tok_slow", 500))
	if err != nil {
		return err
	}
	show("duplicate, one attempt", dup)
	retried, err := t.retrying.Do(ctx, t.request(key, body("tok_slow", 500)))
	if err != nil {
		return err
	}
	show("duplicate, retrying client", retried)
	if first := <-done; first != nil {
		show("the first request", first)
	}
	return nil
}

func (t *tour) reusedKey(ctx context.Context) error {
	t.title("the same key with a different payload")
	key := t.run + "-first"
	r, err := t.once(ctx, t.api, key, body("tok_visa", 2000))
	if err != nil {
		return err
	}
	show("amount 2000 instead of 1000", r)
	_, err = t.retrying.Do(ctx, t.request(key, body("tok_visa", 2000)))
	fmt.Printf("   the client refuses it before sending: %v\n", errors.Is(err, client.ErrKeyReused))
	return nil
}

func (t *tour) declinedReplayed(ctx context.Context) error {
	t.title("a declined card is an answer too: stored and replayed")
	key := t.run + "-declined"
	for _, what := range []string{"first call", "retry"} {
		r, err := t.retrying.Do(ctx, t.request(key, body("tok_chargeDeclined", 700)))
		if err != nil {
			return err
		}
		show(what, r)
	}
	return nil
}

func (t *tour) gatewayError(ctx context.Context) error {
	t.title("a gateway error is not stored: a retry runs again")
	key := t.run + "-gateway"
	for _, what := range []string{"first call", "retry with the same key"} {
		r, err := t.once(ctx, t.api, key, body("tok_gatewayError", 900))
		if err != nil {
			return err
		}
		show(what, r)
	}
	fmt.Println("   (the simulated gateway always fails for tok_gatewayError; a real, transient")
	fmt.Println("    failure would succeed on the retry, and the retry would be its first charge)")
	return nil
}

// crashMidRequest starts a second api on a free port, sends it a slow
// payment, kills it with SIGKILL mid-request, and retries the same payment
// on the main api: it answers 409 until the dead request's lease runs out,
// then runs the payment exactly once.
func (t *tour) crashMidRequest(ctx context.Context, apiBin string) error {
	t.title("an api process killed in the middle of a request")
	if _, err := os.Stat(apiBin); err != nil {
		fmt.Printf("   skipped: %s not found (make tour builds it)\n", apiBin)
		return nil
	}
	addr, err := freeAddr(ctx)
	if err != nil {
		return err
	}
	env := []string{"LEASE_TIMEOUT=3s"}
	if t.gatewayURL != "" {
		// The second api charges through the stack's gateway, as a second
		// replica would: the dead api's call finishes there.
		env = append(env, "GATEWAY_URL="+t.gatewayURL)
	}
	victim, err := t.start(ctx, apiBin, addr, env...)
	if err != nil {
		return err
	}
	defer func() { _ = victim.Process.Kill(); _ = victim.Wait() }()
	base := "http://" + addr
	key := t.run + "-crash"
	go func() { _, _ = t.once(ctx, base, key, body("tok_slow", 1234)) }()
	time.Sleep(500 * time.Millisecond)
	_ = victim.Process.Kill()
	fmt.Printf("   sent tok_slow to a second api (%s, LEASE_TIMEOUT=3s) and killed it with SIGKILL mid-request\n", addr)
	began := time.Now()
	r, err := t.retrying.Do(ctx, t.request(key, body("tok_slow", 1234)))
	if err != nil {
		return err
	}
	show("retry on the main api", r)
	fmt.Printf("   recovered in %s: 409 while the dead request's lease lasted, then one execution\n", time.Since(began).Round(100*time.Millisecond))
	if t.databaseURL == "" {
		fmt.Println("   (not counted: DATABASE_URL is unset; make tour sets it)")
		return nil
	}
	_, err = t.countPayment(ctx, key)
	return err
}

// start starts bin with HTTP_ADDR=addr and env on top of the tour's
// environment, and waits until it is ready.
func (t *tour) start(ctx context.Context, bin, addr string, env ...string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(append(os.Environ(), "HTTP_ADDR="+addr, "LOG_LEVEL=error"), env...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	for i := 0; ; i++ {
		if res, err := t.get(ctx, "http://"+addr+"/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return cmd, nil
			}
		}
		if i > 100 {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s did not start (does it reach DATABASE_URL and REDIS_URL?)", bin)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killedAfterCharge starts a gateway that charges and then holds its answer,
// and a second api that charges through it; the api is killed with SIGKILL
// after the gateway charged, before it recorded the payment. Nobody
// retries: the main api's resumer finishes the payment with the charge the
// gateway made, and a retry that comes later is replayed.
func (t *tour) killedAfterCharge(ctx context.Context, apiBin, gatewayBin string) error {
	t.title("an api killed after the gateway charged: finished with no client retry")
	for _, bin := range []string{apiBin, gatewayBin} {
		if _, err := os.Stat(bin); err != nil {
			fmt.Printf("   skipped: %s not found (make tour builds it)\n", bin)
			return nil
		}
	}
	gwAddr, err := freeAddr(ctx)
	if err != nil {
		return err
	}
	gw, err := t.start(ctx, gatewayBin, gwAddr, "GATEWAY_FAULTS=charge_then_hang=1", "GATEWAY_HANG=2s")
	if err != nil {
		return err
	}
	defer func() { _ = gw.Process.Kill(); _ = gw.Wait() }()
	addr, err := freeAddr(ctx)
	if err != nil {
		return err
	}
	victim, err := t.start(ctx, apiBin, addr, "LEASE_TIMEOUT=3s", "GATEWAY_URL=http://"+gwAddr)
	if err != nil {
		return err
	}
	defer func() { _ = victim.Process.Kill(); _ = victim.Wait() }()

	key := t.run + "-charged"
	go func() { _, _ = t.once(ctx, "http://"+addr, key, body("tok_visa", 4321)) }()
	time.Sleep(time.Second) // the gateway has charged and holds its answer for 2 s
	_ = victim.Process.Kill()
	killed := time.Now()
	fmt.Printf("   a second api (%s, LEASE_TIMEOUT=3s) called a gateway that charges, then holds its answer;\n", addr)
	fmt.Println("   the api was killed with SIGKILL after the charge, before the payment row. No client retries.")
	for {
		show, err := exec.CommandContext(ctx, apiBin, "keys", "show", "acct_demo", key).Output()
		if err == nil && strings.Contains(string(show), `"status": "completed"`) {
			break
		}
		if time.Since(killed) > 30*time.Second {
			return fmt.Errorf("the payment was not finished 30 s after the kill: %s", show)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("   finished by the main api's resumer %s after the kill (lease + RESUME_INTERVAL)\n",
		time.Since(killed).Round(100*time.Millisecond))
	r, err := t.once(ctx, t.api, key, body("tok_visa", 4321))
	if err != nil {
		return err
	}
	show("a client retry later", r)
	return nil
}

// metrics prints the engine's counters from the api's /metrics.
func (t *tour) metrics(ctx context.Context) error {
	t.title("what the api counted (/metrics)")
	res, err := t.get(ctx, t.api+"/metrics")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("read /metrics: %w", err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.HasPrefix(line, "onceonly_requests_total") || strings.HasPrefix(line, "onceonly_redis_fallback_total") ||
			strings.HasPrefix(line, "onceonly_resumptions_total") {
			fmt.Println("   " + line)
		}
	}
	fmt.Println("   relay: curl -s localhost:8081/metrics | grep ^onceonly_relay; reconciler: localhost:8082/metrics")
	return nil
}

func (t *tour) ping(ctx context.Context) error {
	res, err := t.get(ctx, t.api+"/healthz")
	if err != nil {
		return err
	}
	res.Body.Close()
	return nil
}

// get sends a GET to url; the caller closes the body.
func (t *tour) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("build the request: %w", err)
	}
	res, err := t.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	return res, nil
}

func freeAddr(ctx context.Context) (string, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
