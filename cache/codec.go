package cache

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strconv"

	"github.com/onceonly/onceonly/keystate"
)

// The value layout is documented in lua/decode.lua, which reads it in Redis;
// this file writes and reads it in Go.

const (
	flagProvisional = 'p'
	flagConfirmed   = 'c'
	flagMarker      = 'm'
	flagHeaders     = 'h'

	digestLen = 8
	ownerLen  = 16

	// jsonContentType is stored as an empty content type, and a response
	// without one as noContentType (not a media type, so never ambiguous).
	jsonContentType = "application/json"
	noContentType   = "-"
)

// ErrCorrupt is returned by Decode for a value that is not in the layout.
var ErrCorrupt = errors.New("cache value is not in the onceonly layout")

// Digest is the fingerprint as the cache keeps it: the first 8 bytes of the
// SHA-256 of the full fingerprint string. Postgres keeps the full string.
func Digest(fingerprint string) string {
	sum := sha256.Sum256([]byte(fingerprint))
	return string(sum[:digestLen])
}

// Entry is a decoded cache value.
type Entry struct {
	State   keystate.Status
	Version int64
	// Provisional is true for a claim made by the check script that Postgres
	// has not confirmed yet.
	Provisional bool
	// Digest is the fingerprint digest (see Digest).
	Digest string
	// LeaseUntilMs is the lease deadline in Redis time (in_progress only).
	LeaseUntilMs int64
	// Owner is the lease holder's token (in_progress only).
	Owner keystate.Owner
	// Response is the stored response (completed only). Its Body is nil when
	// BodyInPostgres is true.
	Response keystate.Response
	// BodyInPostgres marks a completed key whose body was too large for the
	// cache: the caller reads it from Postgres.
	BodyInPostgres bool
}

// Decode parses a cache value.
func Decode(v []byte) (Entry, error) {
	var e Entry
	a := bytes.IndexByte(v, ':')
	if a < 0 {
		return e, ErrCorrupt
	}
	b := bytes.IndexByte(v[a+1:], ':')
	if b < 0 {
		return e, ErrCorrupt
	}
	b += a + 1
	e.State = keystate.Status(v[:a])
	if !e.State.Valid() {
		return e, ErrCorrupt
	}
	version, err := strconv.ParseInt(string(v[a+1:b]), 10, 64)
	if err != nil || len(v) < b+2+digestLen {
		return e, ErrCorrupt
	}
	e.Version = version
	flag := v[b+1]
	e.Digest = string(v[b+2 : b+2+digestLen])
	tail := v[b+2+digestLen:]
	switch e.State {
	case keystate.InProgress:
		e.Provisional = flag == flagProvisional
		c := bytes.IndexByte(tail, ':')
		if c < 0 || len(tail)-c-1 != ownerLen {
			return e, ErrCorrupt
		}
		if e.LeaseUntilMs, err = strconv.ParseInt(string(tail[:c]), 10, 64); err != nil {
			return e, ErrCorrupt
		}
		copy(e.Owner[:], tail[c+1:])
	case keystate.Completed:
		if len(tail) < 3 {
			return e, ErrCorrupt
		}
		if e.Response.Status, err = strconv.Atoi(string(tail[:3])); err != nil {
			return e, ErrCorrupt
		}
		if flag == flagMarker {
			e.BodyInPostgres = true
			return e, nil
		}
		nl := bytes.IndexByte(tail[3:], '\n')
		if nl < 0 {
			return e, ErrCorrupt
		}
		e.Response.ContentType = string(tail[3 : 3+nl])
		switch e.Response.ContentType {
		case "":
			e.Response.ContentType = jsonContentType
		case noContentType:
			e.Response.ContentType = ""
		}
		rest := tail[3+nl+1:]
		if flag == flagHeaders {
			// <header bytes, decimal>\n<header lines><body>
			c := bytes.IndexByte(rest, '\n')
			if c < 0 {
				return e, ErrCorrupt
			}
			n, err := strconv.Atoi(string(rest[:c]))
			if err != nil || n < 0 || n > len(rest)-c-1 {
				return e, ErrCorrupt
			}
			e.Response.Header = keystate.DecodeHeader(string(rest[c+1 : c+1+n]))
			rest = rest[c+1+n:]
		}
		e.Response.Body = rest
	case keystate.Failed: // nothing after the digest
	}
	return e, nil
}

// head encodes everything up to and including the fingerprint digest.
func head(buf []byte, state keystate.Status, version int64, flag byte, digest string) []byte {
	buf = append(buf, state...)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, version, 10)
	buf = append(buf, ':', flag)
	return append(buf, digest...)
}

// encodeCompleted encodes a completed value; large marks a body kept in
// Postgres only.
func encodeCompleted(version int64, digest string, r keystate.Response, large bool) []byte {
	header := keystate.EncodeHeader(r.Header)
	flag := byte(flagConfirmed)
	switch {
	case large:
		flag = flagMarker
	case header != "":
		flag = flagHeaders
	}
	buf := make([]byte, 0, 40+len(r.ContentType)+len(header)+len(r.Body))
	buf = head(buf, keystate.Completed, version, flag, digest)
	buf = strconv.AppendInt(buf, int64(r.Status), 10)
	if large {
		return buf
	}
	switch r.ContentType {
	case jsonContentType:
	case "":
		buf = append(buf, noContentType...)
	default:
		buf = append(buf, r.ContentType...)
	}
	buf = append(buf, '\n')
	if flag == flagHeaders {
		buf = strconv.AppendInt(buf, int64(len(header)), 10)
		buf = append(buf, '\n')
		buf = append(buf, header...)
	}
	return append(buf, r.Body...)
}
