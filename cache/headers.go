package cache

import (
	"bytes"
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/keystate"
)

// ExpectAbsent is the expectation of a compare-and-set write that applies only where the
// cache holds no value.
const ExpectAbsent = "!absent"

// headerLen is how much of a value ReadHeaders fetches: the state, version,
// flag and fingerprint digest, and the lease deadline of an in_progress key.
const headerLen = 64

// Header is the start of a cache value as ReadHeaders saw it.
type Header struct {
	// Raw is the value's first bytes; empty when the key is absent. Passed as
	// the expectation of RepairBatch, it makes a compare-and-set against what
	// was seen.
	Raw string
	// Found is false when the key is absent.
	Found bool
	// Corrupt is true for a value that is not in the layout (or not a
	// string); State and Version are then unset.
	Corrupt     bool
	State       keystate.Status
	Version     int64
	Provisional bool
	// LeaseUntilMs is the lease deadline of an in_progress value, in Redis
	// time (see RedisTimeMs); 0 if not read.
	LeaseUntilMs int64
	// Unavailable is true when Redis could not serve the key (its cluster
	// node is down): nothing is known about it, and Found is false.
	Unavailable bool
}

// Expect returns the expectation (see RepairBatch) that applies only if the value is still
// the one this header was read from.
func (h Header) Expect() string {
	if !h.Found {
		return ExpectAbsent
	}
	if h.Corrupt {
		return "" // a corrupt value is overwritten by the plain apply
	}
	return h.Raw
}

// ParseHeader decodes the start of a cache value of either layout (at least
// the state, version, flag and digest; the lease deadline of an in_progress
// value if present). Raw and Found are set; a value out of the layout is
// Corrupt.
func ParseHeader(raw []byte) Header {
	h := Header{Raw: string(raw), Found: true, Corrupt: true}
	p, ok := parsePrefix(raw)
	if !ok {
		return h
	}
	h.Corrupt, h.State, h.Version, h.Provisional = false, p.state, p.version, p.flag == flagProvisional
	if p.state == keystate.InProgress {
		if c := bytes.IndexByte(raw[p.tail:], ':'); c > 0 {
			h.LeaseUntilMs, _ = parseDigits(raw[p.tail : p.tail+c])
		}
	}
	return h
}

// ReadHeaders reads the start of the values of keys (full Redis key names)
// in one pipeline. Keys on a cluster node that cannot serve come back
// Unavailable; when no key could be read, the error wraps ErrUnavailable.
func (c *Cache) ReadHeaders(ctx context.Context, keys []string) ([]Header, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	// Per-command results carry the errors; a connection failure shows in
	// every one of them.
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.GetRange(ctx, k, 0, headerLen-1)
		}
		return nil
	})
	headers := make([]Header, len(keys))
	var unavailable int
	var lastErr error
	for i, cmd := range cmds {
		raw, cerr := cmd.Result()
		switch {
		case cerr == nil:
		case Unavailable(cerr):
			headers[i] = Header{Unavailable: true}
			unavailable, lastErr = unavailable+1, cerr
			continue
		default: // WRONGTYPE: a foreign value
			headers[i] = Header{Found: true, Corrupt: true}
			continue
		}
		if raw == "" {
			continue // absent (GETRANGE of a missing key is empty)
		}
		headers[i] = ParseHeader([]byte(raw))
	}
	if unavailable > 0 && unavailable == len(keys) {
		return nil, fmt.Errorf("read headers: %w: %w", ErrUnavailable, lastErr)
	}
	return headers, nil
}

// RedisTimeMs returns the clock of the Redis server c in milliseconds, the
// clock leases in Redis are measured by.
func RedisTimeMs(ctx context.Context, c redis.Cmdable) (int64, error) {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("read Redis time: %w", err)
	}
	return t.UnixMilli(), nil
}

// DeleteBatch deletes the values of names (full Redis key names) in one
// pipeline, each only if it still starts with the matching expect (see
// RepairBatch; a live provisional claim is never deleted).
func (c *Cache) DeleteBatch(ctx context.Context, names, expect []string) ([]ApplyResult, error) {
	return c.applyNamed(ctx, len(names), func(i int) (string, []any, error) {
		return names[i], []any{0, "", 0, "", "", expect[i]}, nil
	})
}
