package cache

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/keystate"
)

// incompressible is 1 KiB of noise.
var incompressible = func() []byte {
	b := make([]byte, 1024)
	for i := range b {
		b[i] = byte(i*i*2654435761>>13 ^ i)
	}
	return b
}()

// packedCases are responses layout 2 must give back exactly.
var packedCases = []struct {
	name string
	r    keystate.Response
}{
	{"JSON201", keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"pay_1"}`)}},
	{"NoContentType", keystate.Response{Status: 200, Body: []byte("raw")}},
	{"Text", keystate.Response{Status: 402, ContentType: "text/plain; charset=utf-8", Body: []byte("declined\n")}},
	{"OtherType", keystate.Response{Status: 422, ContentType: "application/problem+json", Body: []byte(`{}`)}},
	{"LongType", keystate.Response{Status: 415, ContentType: "application/x-" + strings.Repeat("t", 300), Body: []byte("b")}},
	{"EmptyBody", keystate.Response{Status: 204, ContentType: "application/json", Body: []byte{}}},
	{"Lowest", keystate.Response{Status: 100, ContentType: "application/json", Body: []byte("x")}},
	{"HighBits1", keystate.Response{Status: 356, ContentType: "application/json", Body: []byte("x")}},
	{"HighBits2", keystate.Response{Status: 612, ContentType: "application/json", Body: []byte("x")}},
	{"Highest", keystate.Response{Status: 999, ContentType: "application/json", Body: []byte("x")}},
	{"Compressible", keystate.Response{Status: 200, ContentType: "application/json", Body: CompressibleBody}},
	{"Incompressible", keystate.Response{Status: 200, ContentType: "application/octet-stream", Body: incompressible}},
	{"BinaryBody", keystate.Response{Status: 200, ContentType: "application/octet-stream", Body: []byte("\x00:\n\xff\x80completed:1:")}},
	{"Headers", keystate.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"pay_1"}`),
		Header: http.Header{
			"Location":                       {"/v1/payments/pay_1"},
			"X-Multi":                        {"a", "b: c", ""},
			"Set-Cookie":                     {"a=1", "b=2"},
			"X-N" + strings.Repeat("n", 200): {strings.Repeat("v", 300)},
		}}},
}

func TestPackedRoundTrip(t *testing.T) {
	t.Parallel()
	digest := digestOf("v1:abc")
	for _, tc := range packedCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := encodeCompleted(7, &digest, tc.r, false, DefaultCompressMin)
			require.NoError(t, err)
			require.True(t, bytes.HasPrefix(v, []byte("completed:7:")), "operators read state and version: %q", v)
			e, err := Decode(v)
			require.NoError(t, err)
			require.Equal(t, keystate.Completed, e.State)
			require.EqualValues(t, 7, e.Version)
			require.Equal(t, Digest("v1:abc"), e.Digest)
			require.False(t, e.BodyInPostgres)
			require.Equal(t, tc.r, e.Response)

			h := ParseHeader(v[:min(len(v), headerLen)])
			require.False(t, h.Corrupt)
			require.Equal(t, keystate.Completed, h.State)
			require.EqualValues(t, 7, h.Version)
			require.False(t, h.Provisional)

			m, err := encodeCompleted(7, &digest, tc.r, true, DefaultCompressMin)
			require.NoError(t, err)
			e, err = Decode(m)
			require.NoError(t, err)
			require.True(t, e.BodyInPostgres)
			require.Equal(t, tc.r.Status, e.Response.Status)
			require.Nil(t, e.Response.Body)
			require.False(t, ParseHeader(m).Corrupt)
		})
	}
}

// TestPackedSize pins the overhead the memory budget rests on: a JSON
// response costs its state and version header, a flag, 6 bytes of digest
// and a status byte beyond its body.
func TestPackedSize(t *testing.T) {
	t.Parallel()
	digest := digestOf("v1:abc")
	v, err := encodeCompleted(2, &digest, keystate.Response{Status: 201, ContentType: "application/json", Body: make([]byte, 200)}, false, DefaultCompressMin)
	require.NoError(t, err)
	require.Len(t, v, len("completed:2:")+1+shortDigestLen+1+200)
}

// TestCompression: a body of DefaultCompressMin bytes or more is stored
// deflated when that saves an eighth, and a deflate stream that does not
// inflate to its length is corrupt.
func TestCompression(t *testing.T) {
	t.Parallel()
	digest := digestOf("v1:abc")
	r := keystate.Response{Status: 200, ContentType: "application/json", Body: CompressibleBody}
	v, err := encodeCompleted(2, &digest, r, false, DefaultCompressMin)
	require.NoError(t, err)
	require.Less(t, len(v), len(CompressibleBody)/2, "deflated")
	plain, err := encodeCompleted(2, &digest, r, false, 0)
	require.NoError(t, err)
	require.Greater(t, len(plain), len(CompressibleBody), "compression off")
	t.Logf("a %d-byte JSON body is stored in %d bytes", len(CompressibleBody), len(v))

	noise, err := encodeCompleted(2, &digest, keystate.Response{Status: 200, Body: incompressible}, false, DefaultCompressMin)
	require.NoError(t, err)
	require.True(t, bytes.HasSuffix(noise, incompressible), "kept as is when deflate does not pay")

	for _, n := range []int{1, 2, len(v) / 2} {
		_, err := Decode(v[:len(v)-n])
		require.ErrorIs(t, err, ErrCorrupt, "cut %d bytes short", n)
	}
	lied := bytes.Clone(v)
	lied[len("completed:2:")+1+shortDigestLen+1]++ // the body's stated length
	_, err = Decode(lied)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestHeaderValueNewlines(t *testing.T) {
	t.Parallel()
	digest := digestOf("v1:abc")
	r := keystate.Response{Status: 200, Header: http.Header{"location": {"/a\r\nX-Evil: 1"}}}
	v, err := encodeCompleted(1, &digest, r, false, DefaultCompressMin)
	require.NoError(t, err)
	e, err := Decode(v)
	require.NoError(t, err)
	require.Equal(t, http.Header{"Location": {"/a  X-Evil: 1"}}, e.Response.Header,
		"names canonical, CR and LF sent as spaces, as net/http writes them")
}

func TestLayout1Decodes(t *testing.T) {
	t.Parallel()
	for _, tc := range packedCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := EncodeLayout1(3, "v1:abc", tc.r, false)
			e, err := Decode(v)
			require.NoError(t, err)
			require.Equal(t, Digest("v1:abc"), e.Digest)
			require.EqualValues(t, 3, e.Version)
			want := tc.r
			if len(want.Body) == 0 {
				want.Body = nil // layout 1 gives back an empty body as nil
			}
			if want.Header != nil {
				want.Header = keystate.DecodeHeader(keystate.EncodeHeader(want.Header))
			}
			if len(e.Response.Body) == 0 {
				e.Response.Body = nil
			}
			require.Equal(t, want, e.Response)
			e, err = Decode(EncodeLayout1(3, "v1:abc", tc.r, true))
			require.NoError(t, err)
			require.True(t, e.BodyInPostgres)
			require.Equal(t, tc.r.Status, e.Response.Status)
		})
	}
}

// FuzzDecode: no value makes Decode or ParseHeader panic, and a value
// Decode accepts has the state and version ParseHeader reads.
func FuzzDecode(f *testing.F) {
	digest := digestOf("v1:abc")
	for _, tc := range packedCases {
		v, err := encodeCompleted(5, &digest, tc.r, false, DefaultCompressMin)
		require.NoError(f, err)
		f.Add(v)
		f.Add(EncodeLayout1(5, "v1:abc", tc.r, false))
	}
	f.Add(head(keystate.InProgress, 3, flagProvisional, &digest))
	f.Add(append(head(keystate.InProgress, 3, flagConfirmed, &digest), "1700000000000:0123456789abcdef"...))
	f.Add(head(keystate.Failed, 3, flagConfirmed, &digest))
	f.Fuzz(func(t *testing.T, v []byte) {
		e, err := Decode(v)
		h := ParseHeader(v)
		if err == nil {
			require.False(t, h.Corrupt)
			require.Equal(t, e.State, h.State)
			require.Equal(t, e.Version, h.Version)
		}
	})
}

// BenchmarkDecode is the Go side of a replay: decoding the value read.
func BenchmarkDecode(b *testing.B) {
	digest := digestOf("v1:abc")
	body := bytes.Repeat([]byte("0"), 200)
	location := http.Header{"Location": {"/v1/payments/pay_" + strings.Repeat("x", 24)}}
	json := func(body []byte, h http.Header) keystate.Response {
		return keystate.Response{Status: 201, ContentType: "application/json", Body: body, Header: h}
	}
	packedValue := func(r keystate.Response, compressMin int) []byte {
		v, err := encodeCompleted(2, &digest, r, false, compressMin)
		require.NoError(b, err)
		return v
	}
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"200B", packedValue(json(body, nil), DefaultCompressMin)},
		{"200B+Location", packedValue(json(body, location), DefaultCompressMin)},
		{"200B/Layout1", EncodeLayout1(2, "v1:abc", json(body, nil), false)},
		{"200B+Location/Layout1", EncodeLayout1(2, "v1:abc", json(body, location), false)},
		{"2KiB-JSON/Deflated", packedValue(json(CompressibleBody, nil), DefaultCompressMin)},
		{"2KiB-JSON/Plain", packedValue(json(CompressibleBody, nil), 0)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(tc.value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
