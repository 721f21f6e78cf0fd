package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/onceonly/onceonly/keystate"
)

// The value layouts are documented in lua/decode.lua, which reads them in
// Redis; this file writes and reads them in Go. Both begin with the ASCII
// header <state>:<version>: and a flag byte:
//
//   - layout 1, every state: <state>:<version>:<flag><digest, 8 bytes><tail>,
//     flag an ASCII letter. Still written for in_progress and failed; a
//     completed value in it (written before layout 2) still decodes.
//   - layout 2, completed only: completed:<version>:<flag><digest, 6
//     bytes><status><tail>, flag with its high bit set, packing the variant,
//     the content type and the status's high bits (see packed*).

const (
	// Layout 1 flags.
	flagProvisional = 'p'
	flagConfirmed   = 'c'
	flagMarker      = 'm'
	flagHeaders     = 'h'

	// Layout 2 flag: packed, then (status-100)>>8 in bits 5-6, a header
	// block in bit 4, the content type in bits 2-3 and where the body is in
	// bits 0-1. The status's low 8 bits follow the digest.
	packed           = 0x80
	packedStatusLow  = 100
	packedStatusHigh = 5
	packedHeaders    = 0x10
	packedTypeShift  = 2
	packedTypeMask   = 0x0c
	packedBodyMask   = 0x03

	// Layout 2 content types (bits 2-3). typeOther is followed by the type:
	// <uvarint length><bytes>.
	typeJSON  = 0
	typeNone  = 1
	typeText  = 2
	typeOther = 3

	// Layout 2 body variants (bits 0-1).
	bodyInline     = 0
	bodyInPostgres = 1
	bodyDeflated   = 2 // <uvarint length><deflate stream>, see deflate

	// digestLen is the digest layout 1 stores (and the check script is
	// given); shortDigestLen, its first bytes, is what layout 2 stores and
	// what every comparison uses.
	digestLen      = 8
	shortDigestLen = 6
	ownerLen       = 16

	jsonContentType = "application/json"
	// textContentType is what net/http's Error and DetectContentType set.
	textContentType = "text/plain; charset=utf-8"
)

// headerNames are the response header names layout 2 writes as one byte:
// code i+1 is headerNames[i]; 0 is a name written out. Append only: a
// name's code never changes.
var headerNames = [...]string{
	"Location", "Cache-Control", "Etag", "Last-Modified", "Link", "Retry-After", "Set-Cookie", "Vary",
	"X-Request-Id", "Request-Id", "X-Correlation-Id", "Traceparent", "Content-Language", "Content-Location",
	"Content-Disposition", "Content-Encoding", "Expires", "Allow", "Www-Authenticate",
	"Access-Control-Allow-Origin", "Access-Control-Expose-Headers", "Strict-Transport-Security",
	"X-Content-Type-Options", "Idempotent-Replayed",
}

// headerCodes is the inverse of headerNames.
var headerCodes = func() map[string]byte {
	m := make(map[string]byte, len(headerNames))
	for i, name := range headerNames {
		m[name] = byte(i + 1)
	}
	return m
}()

// ErrCorrupt is returned by Decode for a value that is not in the layout.
var ErrCorrupt = errors.New("cache value is not in the onceonly layout")

// Digest is the fingerprint as the cache compares it: the first 6 bytes of
// the SHA-256 of the full fingerprint string (another payload matches by
// chance once in 2^48 reuses of a key). Postgres keeps the full string.
func Digest(fingerprint string) string {
	sum := digestOf(fingerprint)
	return string(sum[:shortDigestLen])
}

// digestOf returns the 8-byte digest layout 1 stores; its first 6 bytes
// are Digest.
func digestOf(fingerprint string) [digestLen]byte {
	var buf [128]byte
	var sum [sha256.Size]byte
	if len(fingerprint) <= len(buf) {
		sum = sha256.Sum256(append(buf[:0], fingerprint...))
	} else {
		sum = sha256.Sum256([]byte(fingerprint))
	}
	return [digestLen]byte(sum[:digestLen])
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

// prefix is the decoded start of a value, what the scripts' decode reads.
type prefix struct {
	state   keystate.Status
	version int64
	flag    byte
	// digest is the compared digest (shortDigestLen bytes), aliasing the value.
	digest []byte
	// tail is where the rest starts: layout 1, after the digest; layout 2,
	// at the status byte.
	tail int
}

// packedLayout reports whether p is a layout 2 value.
func (p prefix) packedLayout() bool { return p.state == keystate.Completed && p.flag&packed != 0 }

// parsePrefix reads the state, version, flag and digest of v, accepting
// what decode.lua accepts (or less: a value Go rejects goes to the scripts,
// never the other way round).
func parsePrefix(v []byte) (p prefix, ok bool) {
	a := bytes.IndexByte(v, ':')
	if a < 0 {
		return p, false
	}
	switch string(v[:a]) {
	case "in_progress":
		p.state = keystate.InProgress
	case "completed":
		p.state = keystate.Completed
	case "failed":
		p.state = keystate.Failed
	default:
		return p, false
	}
	b := bytes.IndexByte(v[a+1:], ':')
	if b < 0 {
		return p, false
	}
	b += a + 1
	if p.version, ok = parseDigits(v[a+1 : b]); !ok || len(v) < b+2 {
		return p, false
	}
	p.flag = v[b+1]
	n := digestLen
	if p.packedLayout() {
		n = shortDigestLen + 1 // and the status byte
	}
	if len(v) < b+2+n {
		return p, false
	}
	p.digest = v[b+2 : b+2+shortDigestLen]
	p.tail = b + 2 + digestLen
	if p.packedLayout() {
		p.tail = b + 2 + shortDigestLen
	}
	return p, true
}

// parseDigits parses a non-negative decimal of at most 18 digits.
func parseDigits(s []byte) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// Decode parses a cache value of either layout. A completed entry's body
// aliases v.
func Decode(v []byte) (Entry, error) {
	p, ok := parsePrefix(v)
	if !ok {
		return Entry{}, ErrCorrupt
	}
	return decodeRest(p, v)
}

// decodeRest decodes what follows p in v.
func decodeRest(p prefix, v []byte) (Entry, error) {
	e := Entry{State: p.state, Version: p.version, Digest: string(p.digest)}
	tail := v[p.tail:]
	var err error
	switch {
	case p.state == keystate.InProgress:
		e.Provisional = p.flag == flagProvisional
		c := bytes.IndexByte(tail, ':')
		if c < 0 || len(tail)-c-1 != ownerLen {
			return e, ErrCorrupt
		}
		var ok bool
		if e.LeaseUntilMs, ok = parseDigits(tail[:c]); !ok {
			return e, ErrCorrupt
		}
		copy(e.Owner[:], tail[c+1:])
	case p.packedLayout():
		err = decodePacked(&e, p.flag, tail)
	case p.state == keystate.Completed:
		err = decodeLayout1(&e, p.flag, tail)
	case p.state == keystate.Failed: // nothing after the digest
	}
	return e, err
}

// decodePacked decodes the tail of a layout 2 completed value:
// <status low byte>[<uvarint n><content type, n bytes>][<header block>]<body>.
func decodePacked(e *Entry, flag byte, tail []byte) error {
	e.Response.Status = packedStatusLow + int(flag>>packedStatusHigh&3)<<8 + int(tail[0])
	if e.Response.Status > 999 {
		return ErrCorrupt
	}
	rest := tail[1:]
	switch flag & packedBodyMask {
	case bodyInline, bodyDeflated:
	case bodyInPostgres:
		e.BodyInPostgres = true
		return nil
	default:
		return ErrCorrupt
	}
	switch (flag & packedTypeMask) >> packedTypeShift {
	case typeJSON:
		e.Response.ContentType = jsonContentType
	case typeNone:
	case typeText:
		e.Response.ContentType = textContentType
	case typeOther:
		ct, n := lengthPrefixed(rest)
		if n == 0 {
			return ErrCorrupt
		}
		e.Response.ContentType, rest = string(ct), rest[n:]
	}
	if flag&packedHeaders != 0 {
		h, n := decodeHeaderBlock(rest)
		if n == 0 {
			return ErrCorrupt
		}
		e.Response.Header, rest = h, rest[n:]
	}
	if flag&packedBodyMask == bodyDeflated {
		body, err := inflate(rest)
		if err != nil {
			return err
		}
		rest = body
	}
	e.Response.Body = rest
	return nil
}

// lengthPrefixed reads <uvarint n><n bytes> from b; n is the bytes read
// in all, 0 if b does not hold that.
func lengthPrefixed(b []byte) (field []byte, n int) {
	l, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, 0
	}
	rest := b[k:]
	if l > uint64(len(rest)) {
		return nil, 0
	}
	field = rest[:l]
	return field, k + len(field)
}

// appendLengthPrefixed appends <uvarint len(s)><s>.
func appendLengthPrefixed(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// decodeHeaderBlock reads a header block: <uvarint count> then, per value,
// <name code>[<name, length-prefixed> if code 0]<value, length-prefixed>.
// n is the block's length, 0 if b does not hold one.
func decodeHeaderBlock(b []byte) (http.Header, int) {
	count, k := binary.Uvarint(b)
	if k <= 0 || count == 0 || count > uint64(len(b)) {
		return nil, 0
	}
	// A first pass finds the block's end; the names written out and the
	// values are then sliced from one string of the block.
	end := k
	for range count {
		var ok bool
		if _, _, _, end, ok = headerEntry(b, end); !ok {
			return nil, 0
		}
	}
	block := string(b[:end])
	h := http.Header{}
	for range count {
		code, name, value, next, _ := headerEntry(b, k)
		n := block[name[0]:name[1]]
		if code > 0 {
			n = headerNames[code-1]
		}
		h[n] = append(h[n], block[value[0]:value[1]])
		k = next
	}
	return h, end
}

// headerEntry reads the header block entry at b[k:]: its name code, where
// its name (code 0) and value are in b, and where the next entry starts.
func headerEntry(b []byte, k int) (code int, name, value [2]int, next int, ok bool) {
	if k >= len(b) {
		return 0, name, value, 0, false
	}
	code = int(b[k])
	k++
	if code > len(headerNames) {
		return 0, name, value, 0, false
	}
	if code == 0 {
		f, n := lengthPrefixed(b[k:])
		if n == 0 {
			return 0, name, value, 0, false
		}
		name, k = [2]int{k + n - len(f), k + n}, k+n
	}
	f, n := lengthPrefixed(b[k:])
	if n == 0 {
		return 0, name, value, 0, false
	}
	return code, name, [2]int{k + n - len(f), k + n}, k + n, true
}

// decodeLayout1 decodes the tail of a layout 1 completed value:
// <status, 3 digits> then, unless the body is in Postgres, <content
// type>\n[<header bytes>\n<header lines>]<body>.
func decodeLayout1(e *Entry, flag byte, tail []byte) error {
	if len(tail) < 3 {
		return ErrCorrupt
	}
	status, ok := parseDigits(tail[:3])
	if !ok {
		return ErrCorrupt
	}
	e.Response.Status = int(status)
	if flag == flagMarker {
		e.BodyInPostgres = true
		return nil
	}
	nl := bytes.IndexByte(tail[3:], '\n')
	if nl < 0 {
		return ErrCorrupt
	}
	switch ct := tail[3 : 3+nl]; string(ct) {
	case "":
		e.Response.ContentType = jsonContentType
	case "-":
		e.Response.ContentType = ""
	default:
		e.Response.ContentType = string(ct)
	}
	rest := tail[3+nl+1:]
	if flag == flagHeaders {
		// <header bytes, decimal>\n<header lines><body>
		c := bytes.IndexByte(rest, '\n')
		if c < 0 {
			return ErrCorrupt
		}
		n, ok := parseDigits(rest[:c])
		if !ok || n > int64(len(rest)-c-1) {
			return ErrCorrupt
		}
		e.Response.Header = keystate.DecodeHeader(string(rest[c+1 : c+1+int(n)]))
		rest = rest[c+1+int(n):]
	}
	e.Response.Body = rest
	return nil
}

// head encodes a layout 1 value up to and including the fingerprint
// digest (in_progress and failed values).
func head(state keystate.Status, version int64, flag byte, digest *[digestLen]byte) []byte {
	buf := make([]byte, 0, len(state)+22+digestLen)
	buf = append(buf, state...)
	buf = append(buf, ':')
	buf = appendDigits(buf, version)
	buf = append(buf, ':', flag)
	return append(buf, digest[:]...)
}

// appendDigits appends n in decimal.
func appendDigits(buf []byte, n int64) []byte {
	var d [20]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(buf, d[i:]...)
}

// encodeLayout1 encodes a completed value in layout 1, as releases before
// layout 2 wrote it and read it (Options.WriteLayout1): the 8-byte digest,
// the status in three digits, the content type and the headers in text.
func encodeLayout1(version int64, digest *[digestLen]byte, r keystate.Response, large bool) []byte {
	header := keystate.EncodeHeader(r.Header)
	flag := byte(flagConfirmed)
	switch {
	case large:
		flag = flagMarker
	case header != "":
		flag = flagHeaders
	}
	buf := make([]byte, 0, 40+len(r.ContentType)+len(header)+len(r.Body))
	buf = append(buf, keystate.Completed...)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, version, 10)
	buf = append(buf, ':', flag)
	buf = append(buf, digest[:]...)
	buf = strconv.AppendInt(buf, int64(r.Status), 10)
	if large {
		return buf
	}
	switch r.ContentType {
	case jsonContentType:
	case "":
		buf = append(buf, '-')
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

// encodeCompleted encodes a completed value in layout 2; large marks a
// body kept in Postgres only; a body of compressMin bytes or more is
// deflated if that pays (0: never). The status must be 100..999.
func encodeCompleted(version int64, digest *[digestLen]byte, r keystate.Response, large bool, compressMin int) ([]byte, error) {
	s := r.Status - packedStatusLow
	if s < 0 || s > 999-packedStatusLow {
		return nil, fmt.Errorf("response status %d out of range", r.Status)
	}
	flag := byte(packed) | byte(s>>8)<<packedStatusHigh
	size := len("completed:") + 20 + 2 + shortDigestLen
	body := r.Body
	if large {
		flag |= bodyInPostgres
	} else {
		if compressMin > 0 && len(body) >= compressMin {
			if d := deflate(body); d != nil {
				flag |= bodyDeflated
				body = d
			}
		}
		size += len(body)
		switch r.ContentType {
		case jsonContentType:
			flag |= typeJSON << packedTypeShift
		case "":
			flag |= typeNone << packedTypeShift
		case textContentType:
			flag |= typeText << packedTypeShift
		default:
			flag |= typeOther << packedTypeShift
			size += binary.MaxVarintLen64 + len(r.ContentType)
		}
		if len(r.Header) > 0 {
			flag |= packedHeaders
			size += headerBlockSize(r.Header)
		}
	}
	buf := make([]byte, 0, size)
	buf = append(buf, keystate.Completed...)
	buf = append(buf, ':')
	buf = appendDigits(buf, version)
	buf = append(buf, ':', flag)
	buf = append(buf, digest[:shortDigestLen]...)
	buf = append(buf, byte(s&0xff))
	if large {
		return buf, nil
	}
	if (flag&packedTypeMask)>>packedTypeShift == typeOther {
		buf = appendLengthPrefixed(buf, r.ContentType)
	}
	if flag&packedHeaders != 0 {
		buf = appendHeaderBlock(buf, r.Header)
	}
	return append(buf, body...), nil
}

// headerBlockSize bounds the length of h's header block.
func headerBlockSize(h http.Header) int {
	n := binary.MaxVarintLen64
	for name, values := range h {
		for _, v := range values {
			n += 1 + 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	return n
}

// appendHeaderBlock appends h as a header block (see decodeHeaderBlock):
// names canonical and sorted, values in order, a value's CR and LF written
// as spaces (as net/http sends them), as keystate.EncodeHeader keeps them.
func appendHeaderBlock(buf []byte, h http.Header) []byte {
	names := make([]string, 0, len(h))
	count := 0
	for name, values := range h {
		names = append(names, name)
		count += len(values)
	}
	slices.Sort(names)
	buf = binary.AppendUvarint(buf, uint64(count))
	for _, name := range names {
		canonical := http.CanonicalHeaderKey(name)
		code := headerCodes[canonical]
		for _, v := range h[name] {
			buf = append(buf, code)
			if code == 0 {
				buf = appendLengthPrefixed(buf, canonical)
			}
			buf = appendLengthPrefixed(buf, strings.Map(noNewline, v))
		}
	}
	return buf
}

// noNewline maps CR and LF to a space.
func noNewline(r rune) rune {
	if r == '\r' || r == '\n' {
		return ' '
	}
	return r
}
