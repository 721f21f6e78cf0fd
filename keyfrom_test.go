package onceonly_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

const orderMsg = `{"order":{"id":"ord_1","lines":[{"sku":"a","qty":2},{"sku":"b","qty":1}]},"amount":1000,"sent_at":"2025-01-01T00:00:00Z","attempt":1}`

func keyFrom(t *testing.T, payload string, paths ...string) string {
	t.Helper()
	key, err := onceonly.KeyFromJSON([]byte(payload), paths...)
	require.NoError(t, err, payload)
	require.NoError(t, onceonly.ValidateKey(key))
	require.Len(t, key, 67)
	require.True(t, strings.HasPrefix(key, "j1:"), key)
	return key
}

func TestKeyFromJSONSameKey(t *testing.T) {
	t.Parallel()
	paths := []string{"order.id", "amount"}
	want := keyFrom(t, orderMsg, paths...)
	for name, payload := range map[string]string{
		"members reordered, whitespace": " {\"attempt\":1 ,\n\"sent_at\":\"2025-01-01T00:00:00Z\",\t\"amount\" : 1000, \"order\":{\"lines\":[],\"id\":\"ord_1\"}}",
		"unselected fields changed":     `{"order":{"id":"ord_1"},"amount":1000,"sent_at":"2025-06-30T12:00:00Z","attempt":7,"trace":"x"}`,
		"number spelled otherwise":      `{"order":{"id":"ord_1"},"amount":1.0e3}`,
		"string escaped otherwise":      `{"order":{"id":"ord\u005f1"},"amount":1000}`,
	} {
		require.Equal(t, want, keyFrom(t, payload, paths...), name)
	}
	require.Equal(t, want, keyFrom(t, orderMsg, "amount", "order.id"), "paths in another order")
	require.Equal(t, want, keyFrom(t, orderMsg, "order.id", "amount", "order.id"), "a path named twice")
}

func TestKeyFromJSONDifferentKey(t *testing.T) {
	t.Parallel()
	base := keyFrom(t, orderMsg, "order.id", "amount")
	seen := map[string]string{base: "base"}
	for name, k := range map[string]string{
		"another id":              keyFrom(t, strings.Replace(orderMsg, "ord_1", "ord_2", 1), "order.id", "amount"),
		"another amount":          keyFrom(t, strings.Replace(orderMsg, "1000", "1001", 1), "order.id", "amount"),
		"amount as a string":      keyFrom(t, strings.Replace(orderMsg, "1000", `"1000"`, 1), "order.id", "amount"),
		"fewer paths":             keyFrom(t, orderMsg, "order.id"),
		"same value, other field": keyFrom(t, `{"refund":{"id":"ord_1"}}`, "refund.id"),
		"whole array":             keyFrom(t, orderMsg, "order.lines"),
		"array element":           keyFrom(t, orderMsg, "order.lines.1"),
		"field of an element":     keyFrom(t, orderMsg, "order.lines.1.sku"),
		"array order matters":     keyFrom(t, strings.Replace(orderMsg, `{"sku":"a","qty":2},{"sku":"b","qty":1}`, `{"sku":"b","qty":1},{"sku":"a","qty":2}`, 1), "order.lines"),
	} {
		require.NotContains(t, seen, k, "%s gives the key of %s", name, seen[k])
		seen[k] = name
	}
	// "order.id" alone is the key of every message with that id.
	require.Equal(t, keyFrom(t, orderMsg, "order.id"), keyFrom(t, `{"order":{"id":"ord_1"}}`, "order.id"))
	// An element is selected by index, the same value as a member.
	require.Equal(t, keyFrom(t, `{"a":{"0":"x"}}`, "a.0"), keyFrom(t, `{"a":["x"]}`, "a.0"))
}

func TestKeyFromJSONPaths(t *testing.T) {
	t.Parallel()
	require.Equal(t,
		keyFrom(t, `{"a.b":{"c\\d":5}}`, `a\.b.c\\d`),
		keyFrom(t, `{"a.b":{"c\\d":5},"a":{"b":{"c\\d":6}}}`, `a\.b.c\\d`))
	require.NotEqual(t,
		keyFrom(t, `{"a.b":5,"a":{"b":5}}`, `a\.b`),
		keyFrom(t, `{"a.b":5,"a":{"b":5}}`, `a.b`))
	keyFrom(t, `[{"id":"x"}]`, "0.id") // a document that is an array
	for _, bad := range []string{"", ".", "a.", ".a", "a..b", `a\b`, `a\`} {
		_, err := onceonly.KeyFromJSON([]byte(orderMsg), bad)
		require.Error(t, err, bad)
		require.NotErrorIs(t, err, onceonly.ErrMissingKeyField, bad)
	}
	_, err := onceonly.KeyFromJSON([]byte(orderMsg))
	require.ErrorContains(t, err, "no paths")
}

func TestKeyFromJSONMissingField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ payload, path string }{
		{orderMsg, "order.customer"},
		{orderMsg, "customer"},
		{orderMsg, "amount.value"},      // a number has no members
		{orderMsg, "order.lines.2"},     // past the end
		{orderMsg, "order.lines.-1"},    // no negative indexes
		{orderMsg, "order.lines.01"},    // an index is written one way
		{orderMsg, "order.lines.first"}, // an array has no names
		{`{"id":null}`, "id"},
		{`{"id":""}`, "id"},
		{`{"id":[]}`, "id"},
		{`{"id":{}}`, "id"},
	} {
		_, err := onceonly.KeyFromJSON([]byte(tc.payload), "amount", tc.path)
		if tc.payload != orderMsg {
			_, err = onceonly.KeyFromJSON([]byte(tc.payload), tc.path)
		}
		require.ErrorIs(t, err, onceonly.ErrMissingKeyField, tc.path+" in "+tc.payload)
		require.ErrorContains(t, err, fmt.Sprintf("%q", tc.path))
	}
	// Falsy values are values.
	keyFrom(t, `{"n":0,"b":false,"s":" "}`, "n", "b", "s")
}

func TestKeyFromJSONInvalidPayload(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{``, "  \n", `{`, `{"id":"x"}{}`, `{"id":"x",}`, `nul`, `{"id":1e999}`} {
		_, err := onceonly.KeyFromJSON([]byte(bad), "id")
		require.Error(t, err, bad)
		require.NotErrorIs(t, err, onceonly.ErrMissingKeyField, bad)
	}
	// A name given twice is refused wherever it is, selected or not:
	// parsers disagree on which of the two counts.
	for _, dup := range []string{`{"id":"x","id":"y"}`, `{"id":"x","meta":{"a":1,"a":2}}`} {
		_, err := onceonly.KeyFromJSON([]byte(dup), "id")
		require.ErrorIs(t, err, onceonly.ErrDuplicateName, dup)
	}
}

// A message redelivered with a new sent_at, its members in another order:
// keyed on its selected fields, the handler runs once. The body as Do's
// payload would make the redelivery a reused key; the key as payload does
// not.
func TestKeyFromJSONWithDo(t *testing.T) {
	t.Parallel()
	ctx := oncetest.Context(t)
	rdb, prefix := oncetest.Redis(t)
	engine, err := onceonly.New(onceonly.Config{Pool: oncetest.DB(t), Redis: rdb, RedisPrefix: prefix})
	require.NoError(t, err)
	t.Cleanup(engine.Close)

	first := []byte(`{"order":{"id":"ord_7"},"amount":500,"sent_at":"2025-01-01T00:00:00Z"}`)
	again := []byte(`{"sent_at":"2025-01-01T00:05:00Z","amount":500,"order":{"id":"ord_7"}}`)
	other := []byte(`{"order":{"id":"ord_8"},"amount":500,"sent_at":"2025-01-01T00:00:00Z"}`)
	runs := 0
	var handle onceonly.Handler = func(context.Context, pgx.Tx) (onceonly.Result, error) {
		runs++
		return onceonly.Result{Status: 200, Body: []byte(`{"ok":true}`)}, nil
	}
	deliver := func(scope string, body []byte, keyAsPayload bool) (onceonly.Outcome, error) {
		key, err := onceonly.KeyFromJSON(body, "order.id", "amount")
		require.NoError(t, err)
		payload := body
		if keyAsPayload {
			payload = []byte(key)
		}
		return engine.Do(ctx, scope, key, payload, handle)
	}

	out, err := deliver("orders", first, true)
	require.NoError(t, err)
	require.False(t, out.Replayed)
	out, err = deliver("orders", again, true)
	require.NoError(t, err)
	require.True(t, out.Replayed)
	out, err = deliver("orders", other, true)
	require.NoError(t, err)
	require.False(t, out.Replayed)
	require.Equal(t, 2, runs)

	_, err = deliver("orders-body", first, false)
	require.NoError(t, err)
	_, err = deliver("orders-body", again, false)
	require.ErrorIs(t, err, onceonly.ErrKeyReused)
	require.Equal(t, 3, runs)
}

// A message without an ID of its own, keyed on the fields that identify
// the operation.
func ExampleKeyFromJSON() {
	body := []byte(`{"order":{"id":"ord_1","lines":[{"sku":"a"}]},"sent_at":"2025-01-01T00:00:00Z"}`)
	key, err := onceonly.KeyFromJSON(body, "order.id", "order.lines.0.sku")
	if err != nil {
		panic(err) // a poison message: dead-letter it
	}
	fmt.Println(key)

	_, err = onceonly.KeyFromJSON([]byte(`{"order":{"id":null}}`), "order.id")
	fmt.Println(err)
	// Output:
	// j1:01873ede8c2536a256eb38f8c08115771e8dc7d3de866a8f63835ca172a2384c
	// onceonly: key field missing, null or empty: "order.id" (null)
}
