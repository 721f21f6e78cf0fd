package onceonly_test

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(method, path, query, body string) string {
		t.Helper()
		r := httptest.NewRequestWithContext(t.Context(), method, (&url.URL{Path: path, RawQuery: query}).String(), strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		f, err := onceonly.RequestFingerprint(r, []byte(body))
		require.NoError(t, err)
		return f
	}
	a := fp("POST", "/v1/payments", "", `{"a":1,"b":2}`)
	require.Equal(t, a, fp("POST", "/v1/payments", "", `{ "b":2, "a":1 }`))
	require.True(t, strings.HasPrefix(a, "v2:"))
	require.Equal(t, fp("POST", "/x", "b=2&a=1", ``), fp("POST", "/x", "a=1&b=2", ``), "parameter order does not matter")
	require.Equal(t, fp("POST", "/x", "a=%31", ``), fp("POST", "/x", "a=1", ``), "escapes do not matter")
	for _, other := range [][4]string{
		{"PUT", "/v1/payments", "", `{"a":1,"b":2}`},
		{"POST", "/v1/refunds", "", `{"a":1,"b":2}`},
		{"POST", "/v1/payments", "", `{"a":1,"b":3}`},
		{"POST", "/v1/payments", "dry_run=true", `{"a":1,"b":2}`},
		{"POST", "/v1/payments", "dry_run=", `{"a":1,"b":2}`},
	} {
		require.NotEqual(t, a, fp(other[0], other[1], other[2], other[3]), other)
	}
	require.NotEqual(t, fp("POST", "/x", "a=1&a=2", ``), fp("POST", "/x", "a=2&a=1", ``), "the values of one name keep their order")
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	require.NoError(t, onceonly.ValidateKey("a"))
	require.NoError(t, onceonly.ValidateKey(strings.Repeat("~", 255)))
	require.NoError(t, onceonly.ValidateKey("550e8400-e29b-41d4-a716-446655440000"))
	for _, bad := range []string{"", " ", "a b", strings.Repeat("k", 256), "\x7f", "\x00", "é"} {
		require.ErrorIs(t, onceonly.ValidateKey(bad), onceonly.ErrInvalidKey, "%q", bad)
	}
}

func TestValidateScope(t *testing.T) {
	t.Parallel()
	for _, good := range []string{"a", "acct_1", "tenant/é", strings.Repeat("s", 255)} {
		require.NoError(t, onceonly.ValidateScope(good), "%q", good)
	}
	for _, bad := range []string{"", "a:b", strings.Repeat("s", 256), "\x00", "a\x00b", "\xff", "a\xc3("} {
		require.ErrorIs(t, onceonly.ValidateScope(bad), onceonly.ErrInvalidScope, "%q", bad)
	}
}

// FuzzValidateKey: a key is valid exactly when it is 1..255 bytes of 0x21..0x7E.
func FuzzValidateKey(f *testing.F) {
	for _, seed := range []string{"a", "", "a b", "key-1", "\x7f", "é", strings.Repeat("k", 256)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) >= 1 && len(key) <= 255
		for i := range len(key) {
			if key[i] < 0x21 || key[i] > 0x7e {
				want = false
			}
		}
		if got := onceonly.ValidateKey(key) == nil; got != want {
			t.Fatalf("ValidateKey(%q) valid=%v, want %v", key, got, want)
		}
	})
}

// FuzzCanonicalJSON: canonicalization accepts exactly the valid JSON
// encoding/json accepts (but duplicate names and numbers out of range), is
// idempotent, yields JSON equal in meaning to the input, and never panics.
func FuzzCanonicalJSON(f *testing.F) {
	for _, seed := range []string{`{"b":1,"a":[1,2,{"c":null}]}`, `1.5e3`, `"\u00e9"`, `[]`, `{`, `{"a":1}{}`, ` `,
		`{"a":1,"a":2}`, `{"\u0061":1,"a":2}`, `"\u2028"`, `"\ud800"`, `-0`, `1E+2`, "\"\xff\"", `{"z":{"b":1,"a":2},"y":[]}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := onceonly.CanonicalJSON(doc)
		if err != nil {
			// Refused: not JSON, a duplicate name, or a number out of range.
			if json.Valid(doc) && !errors.Is(err, onceonly.ErrDuplicateName) && !strings.Contains(err.Error(), "out of range") {
				t.Fatalf("valid JSON %q refused: %v", doc, err)
			}
			return
		}
		if len(canon) == 0 {
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("invalid JSON %q accepted as %q", doc, canon)
		}
		if !json.Valid(canon) {
			t.Fatalf("canonical form of %q is not JSON: %q", doc, canon)
		}
		var before, after any
		if json.Unmarshal(doc, &before) == nil && json.Unmarshal(canon, &after) == nil && !reflect.DeepEqual(before, after) {
			t.Fatalf("canonical form of %q means %v, not %v", doc, after, before)
		}
		again, err := onceonly.CanonicalJSON(canon)
		if err != nil || string(again) != string(canon) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", doc, canon, again, err)
		}
	})
}
