// Package canonjson re-encodes JSON documents in one canonical form, so two
// requests that differ only in whitespace, member order or number spelling
// fingerprint alike.
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrDuplicateName is returned for a JSON object that names a member twice:
// parsers disagree on which one counts (the first, the last, an error), so
// the request is refused rather than judged by one of them.
var ErrDuplicateName = errors.New("canonical json: duplicate object member name")

// Canonical re-encodes a JSON document in the style of RFC 8785: object
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
func Canonical(doc []byte) ([]byte, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	c := canonicalizer{in: doc, out: make([]byte, 0, len(doc))}
	c.skipSpace()
	if err := c.value(0); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos != len(c.in) {
		return nil, errors.New("canonical json: trailing data after the document")
	}
	return c.out, nil
}

// maxDepth bounds the nesting of arrays and objects, as encoding/json does.
const maxDepth = 10000

// canonicalizer reads a JSON document once and writes its canonical form:
// a string needing no escape is copied as it is and member names are
// compared as they are read, so a typical request body costs a few
// allocations.
type canonicalizer struct {
	in  []byte
	pos int
	out []byte
}

// member is an object member written to out[start:end], named name
// (unescaped).
type member struct {
	name       []byte
	start, end int
}

func (c *canonicalizer) errorf(format string, args ...any) error {
	return fmt.Errorf("canonical json: offset %d: "+format, append([]any{c.pos}, args...)...)
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value reads one value and writes its canonical form.
func (c *canonicalizer) value(depth int) error {
	if c.pos >= len(c.in) {
		return c.errorf("unexpected end of input")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		_, err := c.str()
		return err
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	default:
		return c.errorf("invalid character %q", b)
	}
}

func (c *canonicalizer) literal(word string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(word)) {
		return c.errorf("invalid literal")
	}
	c.pos += len(word)
	c.out = append(c.out, word...)
	return nil
}

// array reads an array at '['.
func (c *canonicalizer) array(depth int) error {
	if depth > maxDepth {
		return c.errorf("nested too deeply")
	}
	c.pos++
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.in) {
			return c.errorf("unexpected end of input in an array")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return c.errorf("invalid character %q in an array", c.in[c.pos])
		}
	}
}

// object reads an object at '{' and writes its members sorted by name.
func (c *canonicalizer) object(depth int) error {
	if depth > maxDepth {
		return c.errorf("nested too deeply")
	}
	c.pos++
	open := len(c.out)
	c.out = append(c.out, '{')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}
	var buf [8]member
	members := buf[:0]
	for {
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return c.errorf("expected a member name")
		}
		start := len(c.out)
		name, err := c.str()
		if err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return c.errorf("expected ':' after a member name")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		members = append(members, member{name: name, start: start, end: len(c.out)})
		c.skipSpace()
		if c.pos >= len(c.in) {
			return c.errorf("unexpected end of input in an object")
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		if c.in[c.pos] != ',' {
			return c.errorf("invalid character %q in an object", c.in[c.pos])
		}
		c.pos++
		c.out = append(c.out, ',')
	}
	byName := func(a, b member) int { return bytes.Compare(a.name, b.name) }
	if !slices.IsSortedFunc(members, byName) {
		written := slices.Clone(c.out[open+1:])
		slices.SortFunc(members, byName)
		c.out = c.out[:open+1]
		for i, m := range members {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, written[m.start-open-1:m.end-open-1]...)
		}
	}
	for i := 1; i < len(members); i++ {
		if bytes.Equal(members[i-1].name, members[i].name) {
			return fmt.Errorf("%w: %q", ErrDuplicateName, members[i].name)
		}
	}
	c.out = append(c.out, '}')
	return nil
}

// str reads a string at '"', writes its canonical form and returns its
// unescaped bytes. A string with no escape, no control character, valid
// UTF-8 and no U+2028 or U+2029 is its own canonical form.
func (c *canonicalizer) str() ([]byte, error) {
	start := c.pos
	for i := start + 1; i < len(c.in); {
		b := c.in[i]
		switch {
		case b == '"':
			c.pos = i + 1
			c.out = append(c.out, c.in[start:c.pos]...)
			return c.in[start+1 : i], nil
		case b == '\\' || b < 0x20:
			return c.escapedStr(start)
		case b < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(c.in[i:])
			if (r == utf8.RuneError && size == 1) || r == '\u2028' || r == '\u2029' {
				return c.escapedStr(start)
			}
			i += size
		}
	}
	return nil, c.errorf("unterminated string")
}

// escapedStr reads a string at start that needs decoding: encoding/json
// unescapes it (invalid UTF-8 becomes U+FFFD) and writeString escapes it
// minimally.
func (c *canonicalizer) escapedStr(start int) ([]byte, error) {
	end := start + 1
	for end < len(c.in) && c.in[end] != '"' {
		if c.in[end] == '\\' {
			end++
		}
		end++
	}
	if end >= len(c.in) {
		return nil, c.errorf("unterminated string")
	}
	var s string
	if err := json.Unmarshal(c.in[start:end+1], &s); err != nil {
		return nil, c.errorf("invalid string: %w", err)
	}
	c.pos = end + 1
	var buf bytes.Buffer
	writeString(&buf, s)
	c.out = append(c.out, buf.Bytes()...)
	return []byte(s), nil
}

// number reads a number and writes it in its shortest form (writeNumber).
func (c *canonicalizer) number() error {
	start, i := c.pos, c.pos
	digits := func() int {
		n := 0
		for i < len(c.in) && c.in[i] >= '0' && c.in[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if c.in[i] == '-' {
		i++
	}
	if i < len(c.in) && c.in[i] == '0' {
		i++
	} else if digits() == 0 {
		return c.errorf("invalid number")
	}
	if i < len(c.in) && c.in[i] == '.' {
		i++
		if digits() == 0 {
			return c.errorf("invalid number")
		}
	}
	if i < len(c.in) && (c.in[i] == 'e' || c.in[i] == 'E') {
		i++
		if i < len(c.in) && (c.in[i] == '+' || c.in[i] == '-') {
			i++
		}
		if digits() == 0 {
			return c.errorf("invalid number")
		}
	}
	c.pos = i
	var buf bytes.Buffer
	if err := writeNumber(&buf, json.Number(c.in[start:i])); err != nil {
		return err
	}
	c.out = append(c.out, buf.Bytes()...)
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
