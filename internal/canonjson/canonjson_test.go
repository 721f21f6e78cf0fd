package canonjson

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonical(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\"a\" : [ 1 , {\"d\":null,\"c\":true} ] }\t", `{"a":[1,{"c":true,"d":null}]}`},
		{`{"n":1.0}`, `{"n":1}`},
		{`{"n":1e2}`, `{"n":100}`},
		{`{"n":-0}`, `{"n":0}`},
		{`{"n":0.1}`, `{"n":0.1}`},
		{`{"n":123456789012345678901234567890}`, `{"n":123456789012345678901234567890}`},
		{`{"s":"<\u00e9>"}`, `{"s":"<é>"}`},
		{``, ``},
	}
	for _, tc := range cases {
		got, err := Canonical([]byte(tc.in))
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
	}
	for _, bad := range []string{`{`, `{"a":1}{}`, `{"a":1e999}`, `nul`} {
		_, err := Canonical([]byte(bad))
		require.Error(t, err, bad)
	}
}

// TestCanonicalRefusesDuplicateNames: a member named twice, even
// through an escape, is refused, however deep.
func TestCanonicalRefusesDuplicateNames(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{`{"a":1,"a":2}`, `{"a":1,"\u0061":1}`, `[{"x":{"y":1,"y":1}}]`} {
		_, err := Canonical([]byte(doc))
		require.ErrorIs(t, err, ErrDuplicateName, doc)
	}
	got, err := Canonical([]byte(`{"a":{"a":1},"b":{"a":1}}`))
	require.NoError(t, err, "one name in two objects is no duplicate")
	require.JSONEq(t, `{"a":{"a":1},"b":{"a":1}}`, string(got))
}

// BenchmarkCanonicalDemoBody canonicalizes the demo's payment body, the
// work every guarded request does once:
//
//	go test -run '^$' -bench Canonical -benchmem ./internal/canonjson
func BenchmarkCanonicalDemoBody(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}`)
	b.ReportAllocs()
	for range b.N {
		if _, err := Canonical(body); err != nil {
			b.Fatal(err)
		}
	}
}
