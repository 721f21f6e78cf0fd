// Package client calls APIs that honor the Idempotency-Key header, such as
// the onceonly demo payments API, and retries safely.
//
// One logical operation is one Do call: it sends the request with one
// Idempotency-Key, and retries with the same key and the same bytes on
// network errors, 409 (the key is busy), 429 and 5xx, with jittered
// exponential backoff that honors Retry-After, until an answer that is final,
// the attempt limit, or the context's deadline. It never retries other 4xx
// answers, and it refuses to send a key it used before with a different
// payload.
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

// Client sends idempotent requests with retries. The zero value is usable.
type Client struct {
	// HTTP is the underlying client (http.DefaultClient when nil). Give it
	// a timeout: a hung attempt is retried only after it.
	HTTP *http.Client
	// MaxAttempts bounds the attempts per operation (default 8).
	MaxAttempts int
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
// retryable. It returns the last response when attempts or time run out on
// a retryable status, and an error only when no response came at all (or
// for ErrKeyReused).
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
		maxAttempts = 8
	}
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
	return last, nil
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
