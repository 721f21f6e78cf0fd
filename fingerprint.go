package onceonly

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// FingerprintVersion prefixes every fingerprint, so the scheme can change
// without breaking live keys.
const FingerprintVersion = "v1:"

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
// method, the path and the canonical form of the JSON body (see
// CanonicalJSON), so whitespace and key order do not make another payload.
func Fingerprint(method, path string, jsonBody []byte) (string, error) {
	canonical, err := CanonicalJSON(jsonBody)
	if err != nil {
		return "", err
	}
	return fingerprintOf(method, path, canonical), nil
}

// PayloadFingerprint returns the fingerprint of an opaque payload (a message
// body), hashed as it is.
func PayloadFingerprint(payload []byte) string {
	return fingerprintOf("", "", payload)
}

func fingerprintOf(method, path string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{'\n'})
	h.Write([]byte(path))
	h.Write([]byte{'\n'})
	h.Write(body)
	return FingerprintVersion + hex.EncodeToString(h.Sum(nil))
}

// CanonicalJSON re-encodes a JSON document in the style of RFC 8785: object
// keys sorted, no insignificant whitespace, numbers in their shortest form,
// strings with minimal escaping. An empty input stays empty.
func CanonicalJSON(doc []byte) ([]byte, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("canonical json: trailing data after the document")
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		writeString(buf, v)
	case json.Number:
		return writeNumber(buf, v)
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("canonical json: unexpected %T", v)
	}
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
