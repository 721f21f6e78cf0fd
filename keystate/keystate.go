// Package keystate holds the types every part of onceonly shares about an
// idempotency key: its status, its lease owner, its stored response and its
// Postgres row. The store (outbox), the Redis cache, the relay, the
// reconciler and the engine all speak these types, so a key's state is
// defined once and never converted between packages.
//
// The package has no dependencies; see docs/state-machine.md for the life
// of a key and docs/invariants.md for what each transition guarantees.
package keystate

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Status is the state of an idempotency key, spelled as Postgres stores it
// and as the Redis value begins.
type Status string

// The states of an idempotency key.
const (
	// InProgress: an execution holds the key under a lease.
	InProgress Status = "in_progress"
	// Completed: the key holds a stored response that every retry gets.
	Completed Status = "completed"
	// Failed: the last execution ended without a stored response; the next
	// request claims the key again.
	Failed Status = "failed"
)

// Valid reports whether s is one of the three states.
func (s Status) Valid() bool {
	switch s {
	case InProgress, Completed, Failed:
		return true
	}
	return false
}

// Owner is the token of the execution that holds a key's lease. Every write
// an execution makes to its key is fenced by it: once the lease is taken
// over, the old owner's writes match no row.
type Owner [16]byte

// NewOwner returns a random owner token.
func NewOwner() Owner {
	var o Owner
	_, _ = rand.Read(o[:]) // crypto/rand.Read never fails on supported platforms
	return o
}

// IsZero reports whether o is the zero token (no owner).
func (o Owner) IsZero() bool { return o == Owner{} }

// String returns the token in UUID form, as Postgres prints it.
func (o Owner) String() string {
	var b [36]byte
	hex.Encode(b[0:8], o[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], o[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], o[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], o[8:10])
	b[23] = '-'
	hex.Encode(b[24:], o[10:])
	return string(b[:])
}

// Ref names an idempotency key: scope (tenant, merchant, queue) and key.
type Ref struct{ Scope, Key string }

// Response is a stored response: what every retry of a completed key gets.
// Status 0 means 200.
type Response struct {
	Status      int
	ContentType string
	// Header holds the other headers the handler set (Content-Type,
	// Content-Length, Date and hop-by-hop headers are never stored).
	Header http.Header
	Body   []byte
}

// EncodeHeader writes h as "Name: value" lines, names in canonical form and
// sorted, one line per value: the form Postgres and Redis keep. An empty h
// is "".
func EncodeHeader(h http.Header) string {
	if len(h) == 0 {
		return ""
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		for _, v := range h[name] {
			b.WriteString(http.CanonicalHeaderKey(name))
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// DecodeHeader reads what EncodeHeader wrote; "" is a nil header.
func DecodeHeader(s string) http.Header {
	if s == "" {
		return nil
	}
	h := http.Header{}
	for line := range strings.SplitSeq(strings.TrimSuffix(s, "\n"), "\n") {
		name, value, _ := strings.Cut(line, ": ")
		h[name] = append(h[name], value)
	}
	return h
}

// Key is the state of one idempotency key as Postgres holds it. Durations
// were measured by Postgres (now()) when the row was read.
type Key struct {
	Ref
	Status Status
	// Version is bumped by every transition and never repeats for a key,
	// even across its deletion (a key created again starts above the
	// version floor); Redis applies a state only when its version is higher
	// than the one it holds.
	Version int64
	// Fingerprint identifies the request that claimed the key ("v1:…").
	Fingerprint string
	// Owner and LeaseRemaining are set while the key is in progress.
	Owner          Owner
	LeaseRemaining time.Duration
	// Response is set once the key is completed. BodyOmitted means the
	// reader skipped a body larger than the cache keeps (Response.Body is
	// nil then).
	Response    Response
	BodyOmitted bool
	// ExpiresIn is the time left until the row may be deleted; zero or less
	// means the key is gone (expired, purged or deleted), and the cache
	// drops its copy.
	ExpiresIn time.Duration
	// Failures counts the executions of the key that ended failed in its
	// current lifecycle: their handler returned an error, panicked or
	// answered a status that is not stored. Reaped leases, purges,
	// hand-offs and failures of the store do not count. Postgres keeps it;
	// the cache does not.
	Failures int
}

// Gone returns the state of a key that no longer exists, at version: the
// cache drops its copy unless it holds a newer version.
func Gone(ref Ref, version int64) Key {
	return Key{Ref: ref, Version: version}
}
