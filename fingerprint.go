package onceonly

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strings"
	"unicode/utf8"
)

// requestVersion prefixes every request fingerprint, so the scheme can
// change without breaking live keys. Version 2 covers the query string;
// keys stored under version 1 (legacyRequestVersion) are honoured until they
// expire: a request is judged against such a key with its version 1
// fingerprint.
const requestVersion = "v2:"

// legacyRequestVersion prefixes request fingerprints of version 1: method,
// path and canonical body, without the query.
const legacyRequestVersion = "v1:"

// payloadVersion prefixes payload fingerprints (Do, Run), whose scheme has
// not changed since version 1.
const payloadVersion = "v1:"

// MaxKeyLength is the longest idempotency key accepted.
const MaxKeyLength = 255

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

// MaxScopeLength is the longest scope accepted, in bytes.
const MaxScopeLength = 255

// ValidateScope checks a scope: 1 to MaxScopeLength bytes of valid UTF-8
// without ':' (the separator of the key's Redis name) or NUL (which
// Postgres text cannot hold).
func ValidateScope(scope string) error {
	if scope == "" || len(scope) > MaxScopeLength || strings.ContainsAny(scope, ":\x00") || !utf8.ValidString(scope) {
		return ErrInvalidScope
	}
	return nil
}

// payloadFingerprint returns the fingerprint of an opaque payload (a message
// body), hashed as it is.
func payloadFingerprint(payload []byte) string {
	return digest(payloadVersion, "", "", "", payload)
}

// requestFingerprint is the version 2 fingerprint of a request whose body
// is already canonical.
func requestFingerprint(method, path string, query url.Values, body []byte) string {
	return digest(requestVersion, method, path, query.Encode(), body)
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
	if version == requestVersion {
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
