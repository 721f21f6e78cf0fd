package onceonly

import "testing"

// BenchmarkCanonicalJSONDemoBody canonicalizes the demo's payment body, the
// work every guarded request does once:
//
//	go test -run '^$' -bench CanonicalJSON -benchmem .
func BenchmarkCanonicalJSONDemoBody(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}`)
	b.ReportAllocs()
	for range b.N {
		if _, err := CanonicalJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}
