package onceonly

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/onceonly/onceonly/internal/canonjson"
)

// jsonKeyVersion prefixes every key KeyFromJSON derives, so the scheme can
// change without two schemes ever deriving the same key.
const jsonKeyVersion = "j1:"

// KeyFromJSON derives an idempotency key for a message from chosen fields of
// its JSON payload, the way AWS Powertools' event key expressions do, for
// messages that carry no usable ID of their own:
//
//	key, err := onceonly.KeyFromJSON(msg.Body, "order.id", "detail.attempt_of")
//	if err != nil { /* a poison message: dead-letter it, do not process it */ }
//	out, err := engine.Do(ctx, "orders", key, msg.Body, handle)
//
// A path names object members from the top of the document, separated by
// dots: "order.id". A segment of decimal digits ("items.0.sku") indexes an
// array where the value there is an array (and names a member where it is an
// object). A path that ends on an object or array selects it whole. In a
// member name, `\.` stands for a dot and `\\` for a backslash; any other
// backslash, and an empty segment, is an error. There are no wildcards,
// filters or functions.
//
// The key is "j1:" and the hex SHA-256 of the canonical JSON (CanonicalJSON)
// of one object holding each path, as written, and the value it selects: 67
// printable characters that pass ValidateKey. So member order, whitespace
// and number spelling (1, 1.0, 1e0) do not change the key, the order of the
// paths does not either, and two selections that happen to hold the same
// values ("order.id" and "refund.id", both 42) still give two keys.
//
// It fails, rather than derive a key that merges unrelated messages, on an
// empty or invalid document, a document that names an object member twice
// (ErrDuplicateName: parsers disagree on which one counts), no paths, a bad
// path, and a field that is missing, null or empty (ErrMissingKeyField);
// Powertools by default only logs a warning there and runs the message
// without idempotency.
//
// Pitfalls, in the order they bite:
//
//   - Select only what a redelivery repeats. A timestamp the producer sets
//     on each send (sent_at), an attempt counter, a trace or broker message
//     ID that changes per delivery: any of them makes every redelivery a new
//     key, so the handler runs again.
//   - Select everything that tells two operations apart. A key over
//     "customer.id" alone merges every order of that customer: the second
//     is replayed the first one's result and silently never happens. The
//     safest field is an operation ID the producer generated once and kept
//     across its own retries; a key over content (amount, currency,
//     customer) makes two genuinely equal orders one.
//   - Types are part of the value: 1, 1.0 and 1e0 are one number, but "1"
//     (a string) is another key, so a producer that changes a field's type
//     changes keys.
//   - The paths are part of the key: renaming a field, or changing the
//     selection, derives new keys for messages already handled. Change it
//     when no message from before the change can still arrive.
//   - Do judges reuse by its payload, byte for byte. Passing the whole body
//     returns ErrKeyReused for a redelivery whose unselected fields changed
//     (a new sent_at) or that a producer serialized again in another order;
//     when that can happen, pass the key itself as the payload: the
//     selected fields are then the whole identity of the message.
//   - Use a scope per message type, so two types keyed by the same fields
//     never share keys.
func KeyFromJSON(payload []byte, paths ...string) (string, error) {
	if len(paths) == 0 {
		return "", errors.New("onceonly: key from json: no paths")
	}
	canonical, err := canonjson.Canonical(payload)
	if err != nil {
		return "", fmt.Errorf("onceonly: key from json: %w", err)
	}
	if canonical == nil {
		return "", errors.New("onceonly: key from json: empty payload")
	}
	// The canonical form has no duplicate names and valid UTF-8 only, so
	// decoding it into maps loses nothing; numbers stay json.Number.
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return "", fmt.Errorf("onceonly: key from json: %w", err)
	}
	selected := make(map[string]any, len(paths))
	for _, path := range paths {
		segments, err := splitKeyPath(path)
		if err != nil {
			return "", fmt.Errorf("onceonly: key from json: path %q: %w", path, err)
		}
		v, err := selectKeyField(doc, segments)
		if err != nil {
			return "", fmt.Errorf("%w: %q %w", ErrMissingKeyField, path, err)
		}
		selected[path] = v
	}
	raw, err := json.Marshal(selected)
	if err != nil {
		return "", fmt.Errorf("onceonly: key from json: %w", err)
	}
	raw, err = canonjson.Canonical(raw) // Marshal escapes <, > and &; canonical form does not
	if err != nil {
		return "", fmt.Errorf("onceonly: key from json: %w", err)
	}
	sum := sha256.Sum256(raw)
	return jsonKeyVersion + hex.EncodeToString(sum[:]), nil
}

// splitKeyPath splits a dotted path into member names and indexes.
func splitKeyPath(path string) ([]string, error) {
	var segments []string
	var seg strings.Builder
	for i := 0; i < len(path); i++ {
		switch c := path[i]; c {
		case '.':
			if seg.Len() == 0 {
				return nil, errors.New("empty segment")
			}
			segments = append(segments, seg.String())
			seg.Reset()
		case '\\':
			if i+1 == len(path) || (path[i+1] != '.' && path[i+1] != '\\') {
				return nil, errors.New(`a backslash must precede "." or "\"`)
			}
			i++
			seg.WriteByte(path[i])
		default:
			seg.WriteByte(c)
		}
	}
	if seg.Len() == 0 {
		return nil, errors.New("empty segment")
	}
	return append(segments, seg.String()), nil
}

// selectKeyField walks segments down doc and returns the value there; an
// error says why there is none to key on.
func selectKeyField(doc any, segments []string) (any, error) {
	v := doc
	for i, seg := range segments {
		switch node := v.(type) {
		case map[string]any:
			next, ok := node[seg]
			if !ok {
				return nil, fmt.Errorf("(no member %q)", strings.Join(segments[:i+1], "."))
			}
			v = next
		case []any:
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(node) || strconv.Itoa(n) != seg {
				return nil, fmt.Errorf("(no element %s of an array of %d)", seg, len(node))
			}
			v = node[n]
		default:
			return nil, fmt.Errorf("(%q is not an object or array)", strings.Join(segments[:i], "."))
		}
	}
	switch x := v.(type) {
	case nil:
		return nil, errors.New("(null)")
	case string:
		if x == "" {
			return nil, errors.New("(empty string)")
		}
	case []any:
		if len(x) == 0 {
			return nil, errors.New("(empty array)")
		}
	case map[string]any:
		if len(x) == 0 {
			return nil, errors.New("(empty object)")
		}
	}
	return v, nil
}

// CanonicalJSON returns doc in the canonical form JSON requests and
// payloads are fingerprinted in, in the style of RFC 8785: object members
// sorted by name, no insignificant whitespace, numbers in their shortest
// form (integers keep every digit), strings with minimal escaping; an empty
// input stays empty. Two documents that mean the same give the same bytes.
// A document that names an object member twice is refused
// (ErrDuplicateName), as is invalid JSON.
func CanonicalJSON(doc []byte) ([]byte, error) {
	return canonjson.Canonical(doc)
}
