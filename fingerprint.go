package onceonly

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// FingerprintVersion prefixes every request fingerprint, so the scheme can
// change without breaking live keys. Version 2 covers the query string;
// keys stored under version 1 (legacyRequestVersion) are honoured until they
// expire: a request is judged against such a key with its version 1
// fingerprint.
const FingerprintVersion = "v2:"

// legacyRequestVersion prefixes request fingerprints of version 1: method,
// path and canonical body, without the query.
const legacyRequestVersion = "v1:"

// payloadVersion prefixes payload fingerprints (Do, Run), whose scheme has
// not changed since version 1.
const payloadVersion = "v1:"

// MaxKeyLength is the longest idempotency key accepted.
const MaxKeyLength = 255

// ErrInvalidKey is returned for an idempotency key that is empty, longer
// than MaxKeyLength or holds a character outside 0x21..0x7E.
var ErrInvalidKey = errors.New("idempotency key must be 1 to 255 printable ASCII characters without spaces")

// ErrInvalidScope is returned for a scope that is empty, longer than 255
// bytes or contains ':'.
var ErrInvalidScope = errors.New("scope must be 1 to 255 bytes without ':'")

// ValidateKey checks an idempotency key.
func ValidateKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyLength {
		return ErrInvalidKey
	}
	for i := range len(key) {
		if key[i] < 0x21 || key[i] > 0x7e {
			return ErrInvalidKey
		}
	}
	return nil
}

func validateScope(scope string) error {
	if scope == "" || len(scope) > 255 || strings.IndexByte(scope, ':') >= 0 {
		return ErrInvalidScope
	}
	return nil
}

// Fingerprint returns the fingerprint of an HTTP request: a SHA-256 over the
// method, the path, the query (parameters sorted by name, the values of one
// name kept in their order) and the canonical form of the JSON body (see
// CanonicalJSON), so whitespace, member order and parameter order do not
// make another request.
func Fingerprint(method, path string, query url.Values, jsonBody []byte) (string, error) {
	canonical, err := CanonicalJSON(jsonBody)
	if err != nil {
		return "", err
	}
	return requestFingerprint(method, path, query, canonical), nil
}

// PayloadFingerprint returns the fingerprint of an opaque payload (a message
// body), hashed as it is.
func PayloadFingerprint(payload []byte) string {
	return digest(payloadVersion, "", "", "", payload)
}

// requestFingerprint is the version 2 fingerprint of a request whose body
// is already canonical.
func requestFingerprint(method, path string, query url.Values, body []byte) string {
	return digest(FingerprintVersion, method, path, query.Encode(), body)
}

// legacyFingerprint is the version 1 fingerprint of a request, which left
// the query out.
func legacyFingerprint(method, path string, body []byte) string {
	return digest(legacyRequestVersion, method, path, "", body)
}

// digest hashes the parts of a fingerprint under version. Version 1 hashed
// no query line; the layouts of both versions are kept exactly.
func digest(version, method, path, query string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{'\n'})
	h.Write([]byte(path))
	h.Write([]byte{'\n'})
	if version == FingerprintVersion {
		h.Write([]byte(query))
		h.Write([]byte{'\n'})
	}
	h.Write(body)
	return version + hex.EncodeToString(h.Sum(nil))
}

// fingerprint is how a request is judged against a key's stored
// fingerprint: value, or for a key stored under an older version, what
// legacy computes (nil when there is no older form).
type fingerprint struct {
	value  string
	legacy func() string
}

// legacyFor returns the older fingerprint to judge a key stored with held
// by, or "" when there is none.
func (f fingerprint) legacyFor(held string) string {
	if f.legacy == nil || held == f.value || !strings.HasPrefix(held, legacyRequestVersion) {
		return ""
	}
	if l := f.legacy(); l == held {
		return l
	}
	return ""
}

// ErrDuplicateName is returned for a JSON object that names a member twice:
// parsers disagree on which one counts (the first, the last, an error), so
// the request is refused rather than judged by one of them.
var ErrDuplicateName = errors.New("canonical json: duplicate object member name")

// CanonicalJSON re-encodes a JSON document in the style of RFC 8785: object
// members sorted by name, no insignificant whitespace, numbers in their
// shortest form, strings with minimal escaping. An empty input stays empty.
// A document naming an object member twice is refused (ErrDuplicateName).
//
// It differs from RFC 8785 where exactness matters more than conformance:
// names sort by their UTF-8 bytes, not UTF-16 code units (the orders differ
// only between characters above U+FFFF and those in U+E000..U+FFFF);
// integer literals keep every digit instead of becoming IEEE 754 doubles,
// so two amounts that differ past 2^53 stay two requests; U+2028 and
// U+2029 are escaped, as encoding/json does; and invalid UTF-8 becomes
// U+FFFD instead of an error, so a handler that validates its input still
// answers it.
func CanonicalJSON(doc []byte) ([]byte, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var buf bytes.Buffer
	if err := writeCanonical(dec, &buf); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("canonical json: trailing data after the document")
	}
	return buf.Bytes(), nil
}

// member is an object member in canonical form.
type member struct {
	name  string
	value []byte
}

// writeCanonical reads one value from dec and writes its canonical form.
func writeCanonical(dec *json.Decoder, buf *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("canonical json: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return writeArray(dec, buf)
		}
		return writeObject(dec, buf)
	case string:
		writeString(buf, t)
	case json.Number:
		return writeNumber(buf, t)
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("canonical json: unexpected %T", t)
	}
	return nil
}

// writeArray writes the rest of an array whose '[' was read.
func writeArray(dec *json.Decoder, buf *bytes.Buffer) error {
	buf.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := writeCanonical(dec, buf); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return fmt.Errorf("canonical json: %w", err)
	}
	buf.WriteByte(']')
	return nil
}

// writeObject writes the rest of an object whose '{' was read, its members
// sorted by name.
func writeObject(dec *json.Decoder, buf *bytes.Buffer) error {
	var members []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("canonical json: %w", err)
		}
		name, _ := tok.(string) // the decoder only yields strings here
		if seen[name] {
			return fmt.Errorf("%w: %q", ErrDuplicateName, name)
		}
		seen[name] = true
		var value bytes.Buffer
		if err := writeCanonical(dec, &value); err != nil {
			return err
		}
		members = append(members, member{name, value.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return fmt.Errorf("canonical json: %w", err)
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeString(buf, m.name)
		buf.WriteByte(':')
		buf.Write(m.value)
	}
	buf.WriteByte('}')
	return nil
}

func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic("onceonly: a Go string does not encode as JSON: " + err.Error()) // unreachable: every string encodes
	}
	buf.Truncate(buf.Len() - 1) // Encode appends a newline
}

// writeNumber keeps integer literals exact (any size) and writes other
// numbers in their shortest round-trip form, so 1.0, 1e0 and 1 are one number.
func writeNumber(buf *bytes.Buffer, n json.Number) error {
	s := n.String()
	if !strings.ContainsAny(s, ".eE") {
		if s == "-0" {
			s = "0"
		}
		buf.WriteString(s)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("canonical json: number %s out of range", s)
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		buf.WriteString(strconv.FormatInt(int64(f), 10))
		return nil
	}
	buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	return nil
}
