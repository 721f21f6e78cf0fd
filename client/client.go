// Package client calls APIs that honor the Idempotency-Key header, such as
// the onceonly demo payments API, and retries safely.
//
// One logical operation is one Do call: it sends the request with one
// Idempotency-Key, and retries with the same key and the same bytes on
// network errors, 409 (the key is busy), 429 and 5xx, with jittered
// exponential backoff that honors Retry-After, until an answer that is
// final, the attempt limit, MaxElapsed (45 s by default: longer than the
// engine's default lease, 30 s, after which a key whose holder died is
// free again) or the context's deadline. It never retries other 4xx
// answers, and it refuses to send a key it used before with a different
// payload. Do never returns a nil error with an answer that is not final:
// when it gives up on one, its error is a *NotFinalError carrying it.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/onceonly/onceonly/backoff"
)

// Header names used by the client.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// ErrKeyReused is returned by Do for a key already used with another
// payload (method, URL path and query, or body).
var ErrKeyReused = errors.New("client: idempotency key already used with a different payload")

// DefaultMaxElapsed is Client.MaxElapsed when unset: longer than the
// engine's default lease (onceonly.DefaultLeaseTimeout, 30 s), so that a
// retry outlasts a holder that died with the key, whose lease frees it.
const DefaultMaxElapsed = 45 * time.Second

// NotFinalError is Do's error when attempts or time ran out while the
// answer was still retryable (409, 429, 5xx): the operation's outcome is
// not known. Retry it later with the same Request (the same key), which
// answers it. Response is that last answer, also Do's first result.
type NotFinalError struct {
	Method, URL, Key string
	Response         *Response
}

// Error names the operation and its last answer.
func (e *NotFinalError) Error() string {
	return fmt.Sprintf("client: %s %s (key %s): no final answer after %d attempt(s): last %d %s; retry with the same key",
		e.Method, e.URL, e.Key, e.Response.Attempts, e.Response.StatusCode, http.StatusText(e.Response.StatusCode))
}

// Client sends idempotent requests with retries. The zero value is usable.
type Client struct {
	// HTTP is the underlying client (http.DefaultClient when nil). Give it
	// a timeout: a hung attempt is retried only after it.
	HTTP *http.Client
	// MaxAttempts bounds the attempts per operation (default: no bound
	// but MaxElapsed).
	MaxAttempts int
	// MaxElapsed bounds the time an operation retries, from its first
	// attempt (default DefaultMaxElapsed); the context's deadline, when
	// earlier, bounds it too. A retry that could not start before it ends
	// is not sent.
	MaxElapsed time.Duration
	// MinDelay and MaxDelay bound the backoff between attempts (defaults
	// 100ms and 5s). A Retry-After larger than MaxDelay is still honored
	// as long as the deadline allows.
	MinDelay, MaxDelay time.Duration

	mu   sync.Mutex
	used map[string]string // key -> payload digest
	fifo []string          // keys in the order first used, for eviction
}

// rememberedKeys bounds the keys the client remembers to catch reuse.
const rememberedKeys = 100_000

// Request is one logical operation.
type Request struct {
	Method, URL string
	Header      http.Header
	Body        []byte
	// Key is the Idempotency-Key; NewKey() is used when empty.
	Key string
}

// Response is the final answer of an operation.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Key is the Idempotency-Key the operation used.
	Key string
	// Attempts is how many requests were sent.
	Attempts int
	// Replayed is true when the server answered from its stored result.
	Replayed bool
}

// NewKey returns a random Idempotency-Key (32 hex characters).
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Do runs the operation: it sends req and retries it while the answer is
// retryable. A final answer (any status but 409, 429 and 5xx) comes with a
// nil error. When attempts or time run out on a retryable status, it
// returns the last response and a *NotFinalError carrying it; when no
// response came at all, the last error (nil response, unless an earlier
// attempt had one); ErrKeyReused for a key used with another payload.
func (c *Client) Do(ctx context.Context, req Request) (*Response, error) {
	if req.Key == "" {
		req.Key = NewKey()
	}
	if err := c.remember(req); err != nil {
		return nil, err
	}
	retry := backoff.Backoff{Min: orDefault(c.MinDelay, 100*time.Millisecond), Max: orDefault(c.MaxDelay, 5*time.Second)}
	maxAttempts := c.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = math.MaxInt
	}
	giveUp := time.Now().Add(orDefault(c.MaxElapsed, DefaultMaxElapsed))
	var last *Response
	var lastErr error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		resp, err := c.send(ctx, req)
		if err == nil {
			resp.Attempts = attempt
			last, lastErr = resp, nil
			if !Retryable(resp.StatusCode) {
				return resp, nil
			}
		} else {
			if ctx.Err() != nil {
				break
			}
			lastErr = err
		}
		if attempt == maxAttempts {
			break
		}
		delay := retry.Next()
		if last != nil && err == nil {
			if after, ok := retryAfter(last.Header); ok && after > delay {
				delay = after
			}
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
			break // the next attempt could not finish in time
		}
		if time.Until(giveUp) < delay {
			break // MaxElapsed
		}
		if backoff.Sleep(ctx, delay) != nil {
			break
		}
	}
	if lastErr != nil || last == nil {
		if lastErr == nil {
			lastErr = ctx.Err()
		}
		return last, fmt.Errorf("client: %s %s (key %s): %w", req.Method, req.URL, req.Key, lastErr)
	}
	// Only a retryable answer gets here: a final one returned above.
	return last, &NotFinalError{Method: req.Method, URL: req.URL, Key: req.Key, Response: last}
}

// Retryable reports whether a status may change on retry with the same key:
// 409 (in flight), 429 and every 5xx.
func Retryable(status int) bool {
	return status == http.StatusConflict || status == http.StatusTooManyRequests || status >= 500
}

func (c *Client) send(ctx context.Context, req Request) (*Response, error) {
	httpReq, err := http.NewRequestWithContext(ctx, req.Method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range req.Header {
		for _, v := range vs {
			httpReq.Header.Add(k, v)
		}
	}
	httpReq.Header.Set(HeaderKey, req.Key)
	if httpReq.Header.Get("Content-Type") == "" && len(req.Body) > 0 {
		httpReq.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(httpReq)
	if err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	return &Response{
		StatusCode: res.StatusCode, Header: res.Header, Body: body, Key: req.Key,
		Replayed: res.Header.Get(HeaderReplayed) == "true",
	}, nil
}

// remember records the payload of req's key, or fails if the key was used
// with another payload. The payload is the method, the URL's path and query
// and the body: the same operation may go to another host (a replica).
func (c *Client) remember(req Request) error {
	target := req.URL
	if u, err := url.Parse(req.URL); err == nil {
		target = u.RequestURI()
	}
	sum := sha256.New()
	for _, part := range [][]byte{[]byte(req.Method), {0}, []byte(target), {0}, req.Body} {
		sum.Write(part)
	}
	digest := string(sum.Sum(nil))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used == nil {
		c.used = map[string]string{}
	}
	if prev, ok := c.used[req.Key]; ok {
		if prev != digest {
			return fmt.Errorf("%w: %s", ErrKeyReused, req.Key)
		}
		return nil
	}
	if len(c.fifo) >= rememberedKeys {
		delete(c.used, c.fifo[0])
		c.fifo = c.fifo[1:]
	}
	c.used[req.Key] = digest
	c.fifo = append(c.fifo, req.Key)
	return nil
}

// retryAfter reads a Retry-After header in seconds.
func retryAfter(h http.Header) (time.Duration, bool) {
	s, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
