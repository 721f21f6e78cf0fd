// Command openloop sends requests at a fixed rate whatever the answers — an
// open loop — and reports latency percentiles measured from when each
// request was due, not from when it was sent, so a server that falls behind
// shows its queueing (a closed loop like wrk's waits for answers before
// sending more and hides it: coordinated omission).
//
//	openloop -url http://127.0.0.1:29005/v1/payments -rate 5000 -duration 20s -key fixed
//	openloop -url http://127.0.0.1:29005/v1/payments -rate 500 -duration 20s -key unique
//
// -key fixed sends one key (replays of a stored answer), -key unique a new
// key per request (first executions). It prints one line: rate, sent,
// answered, errors, non-2xx and p50/p99/p99.9/max.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the generator's flags.
type options struct {
	url, name, keyMode, body, run string
	rate                          int
	duration, warmup, timeout     time.Duration
	maxInFlight                   int
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("openloop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.url, "url", "", "target URL (required)")
	fs.StringVar(&o.name, "name", "", "label printed with the result")
	fs.StringVar(&o.keyMode, "key", "unique", "fixed (one key: replays) or unique (a key per request: first executions)")
	fs.StringVar(&o.body, "body", `{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}`, "request body")
	fs.StringVar(&o.run, "run", strconv.FormatInt(time.Now().UnixNano(), 36), "prefix of the keys (fixed mode: the key is <run>-0)")
	fs.IntVar(&o.rate, "rate", 1000, "requests per second")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to send (after the warm-up)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "sending before measuring")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "a request unanswered this long is an error")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 20000, "requests outstanding at most; a request due beyond it counts as an error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case o.url == "":
		fmt.Fprintln(stderr, "openloop: -url is required")
		return 2
	case o.rate <= 0 || o.duration <= 0:
		fmt.Fprintln(stderr, "openloop: -rate and -duration must be positive")
		return 2
	case o.keyMode != "fixed" && o.keyMode != "unique":
		fmt.Fprintln(stderr, "openloop: -key must be fixed or unique")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r := load(ctx, o)
	fmt.Fprintln(stdout, r.line(o))
	return 0
}

// result is what one run measured.
type result struct {
	sent, errors, non2xx int64
	latencies            []time.Duration // of measured requests answered 2xx or not
}

// load sends o.rate requests per second for o.warmup + o.duration.
func load(ctx context.Context, o options) *result {
	client := &http.Client{
		Timeout: o.timeout,
		Transport: &http.Transport{
			MaxIdleConns: o.maxInFlight, MaxIdleConnsPerHost: o.maxInFlight, IdleConnTimeout: time.Minute,
		},
	}
	interval := time.Second / time.Duration(o.rate)
	total := int(int64(o.warmup+o.duration) / int64(interval))
	warm := int(int64(o.warmup) / int64(interval))
	var (
		res      result
		mu       sync.Mutex
		wg       sync.WaitGroup
		inFlight atomic.Int64
		errs     atomic.Int64
		non2xx   atomic.Int64
	)
	res.latencies = make([]time.Duration, 0, total-warm)
	start := time.Now()
	for i := range total {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done(): // stops below
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		res.sent++
		measured := i >= warm
		if inFlight.Load() >= int64(o.maxInFlight) {
			if measured {
				errs.Add(1)
			}
			continue
		}
		inFlight.Add(1)
		key := o.run + "-0"
		if o.keyMode == "unique" {
			key = o.run + "-" + strconv.Itoa(i)
		}
		wg.Go(func() {
			defer inFlight.Add(-1)
			status, err := send(ctx, client, o.url, key, o.body)
			took := time.Since(due) // from when it was due: queueing counts
			if !measured {
				return
			}
			switch {
			case err != nil:
				errs.Add(1)
				return
			case status < 200 || status > 299:
				non2xx.Add(1)
			}
			mu.Lock()
			res.latencies = append(res.latencies, took)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.sent -= int64(warm)
	res.errors, res.non2xx = errs.Load(), non2xx.Load()
	return &res
}

// send posts one request and reads its whole answer.
func send(ctx context.Context, client *http.Client, url, key, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_demo")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && !errors.Is(err, context.Canceled) {
		return 0, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, nil
}

// line formats r as one line.
func (r *result) line(o options) string {
	slices.Sort(r.latencies)
	q := func(p float64) string {
		if len(r.latencies) == 0 {
			return "-"
		}
		i := min(len(r.latencies)-1, int(p*float64(len(r.latencies))))
		return fmt.Sprintf("%.2fms", float64(r.latencies[i].Microseconds())/1000)
	}
	return fmt.Sprintf("%-34s rate %6d/s  sent %7d  answered %7d  errors %5d  non-2xx %5d  p50 %-9s p99 %-9s p99.9 %-9s max %s",
		o.name, o.rate, r.sent, len(r.latencies), r.errors, r.non2xx, q(0.50), q(0.99), q(0.999), q(1))
}
