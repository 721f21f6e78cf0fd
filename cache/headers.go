package cache

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ExpectAbsent is the Update.Expect of a write that applies only where the
// cache holds no value.
const ExpectAbsent = "!absent"

// headerLen is how much of a value ReadHeaders fetches: the state, version,
// flag and fingerprint digest, and the lease deadline of an in_progress key.
const headerLen = 64

// Header is the start of a cache value as ReadHeaders saw it.
type Header struct {
	// Raw is the value's first bytes; empty when the key is absent. Passed as
	// Update.Expect, it makes a compare-and-set against what was seen.
	Raw string
	// Found is false when the key is absent.
	Found bool
	// Corrupt is true for a value that is not in the layout (or not a
	// string); State and Version are then unset.
	Corrupt     bool
	State       State
	Version     int64
	Provisional bool
}

// Expect returns the Update.Expect that applies only if the value is still
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

// ParseHeader decodes the start of a cache value.
func ParseHeader(raw []byte) (state State, version int64, flag byte, err error) {
	a := bytes.IndexByte(raw, ':')
	if a < 0 {
		return "", 0, 0, ErrCorrupt
	}
	b := bytes.IndexByte(raw[a+1:], ':')
	if b < 0 {
		return "", 0, 0, ErrCorrupt
	}
	b += a + 1
	state = State(raw[:a])
	switch state {
	case StateInProgress, StateCompleted, StateFailed:
	default:
		return "", 0, 0, ErrCorrupt
	}
	version, err = strconv.ParseInt(string(raw[a+1:b]), 10, 64)
	if err != nil || version < 0 || len(raw) < b+1+1+digestLen {
		return "", 0, 0, ErrCorrupt
	}
	return state, version, raw[b+1], nil
}

// ReadHeaders reads the start of the values of keys (full Redis key names)
// in one pipeline.
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
	for i, cmd := range cmds {
		raw, cerr := cmd.Result()
		switch {
		case cerr == nil:
		case isConnectionError(cerr):
			return nil, fmt.Errorf("read headers: %w", cerr)
		default: // WRONGTYPE: a foreign value
			headers[i] = Header{Found: true, Corrupt: true}
			continue
		}
		if raw == "" {
			continue // absent (GETRANGE of a missing key is empty)
		}
		h := Header{Raw: raw, Found: true}
		state, version, flag, perr := ParseHeader([]byte(raw))
		if perr != nil {
			h.Corrupt = true
		} else {
			h.State, h.Version, h.Provisional = state, version, flag == flagProvisional
		}
		headers[i] = h
	}
	return headers, nil
}
