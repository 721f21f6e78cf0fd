package payments_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/demo/payments"
)

func TestParseMessage(t *testing.T) {
	t.Parallel()
	m, err := payments.ParseMessage([]byte(`{ "source": "tok_visa", "merchant": "acct_1", "amount": 500,
		"currency": "eur", "customer": "cus_1", "description": null }`))
	require.NoError(t, err)
	require.Equal(t, "acct_1", m.Merchant)
	require.Equal(t, `{"amount":500,"currency":"eur","customer":"cus_1","description":null,"source":"tok_visa"}`, string(m.Payload), //nolint:testifylint // the bytes are the point: canonical JSON, not equivalent JSON
		"canonical: members sorted, no whitespace, no merchant")

	// Member order, whitespace and the merchant's place make no other
	// payload; another amount does.
	again, err := payments.ParseMessage([]byte(`{"merchant":"acct_1","description":null,"customer":"cus_1","currency":"eur","amount":500,"source":"tok_visa"}`))
	require.NoError(t, err)
	require.Equal(t, m.Payload, again.Payload)
	other, err := payments.ParseMessage([]byte(`{"merchant":"acct_1","amount":501,"currency":"eur","customer":"cus_1","source":"tok_visa"}`))
	require.NoError(t, err)
	require.NotEqual(t, m.Payload, other.Payload)
}

func TestParseMessageRejects(t *testing.T) {
	t.Parallel()
	const valid = `"amount":500,"currency":"eur","customer":"cus_1","source":"tok_visa"`
	for _, tc := range []struct{ body, want string }{
		{`not json`, "not JSON"},
		{`[1]`, "JSON object"},
		{`null`, "JSON object"},
		{`{` + valid + `} {}`, "trailing data"},
		{`{` + valid + `}`, "missing required parameter: merchant"},
		{`{"merchant":"acct_1","merchant":"acct_2",` + valid + `}`, "twice"},
		{`{"merchant":7,` + valid + `}`, "merchant must be"},
		{`{"merchant":"acct_",` + valid + `}`, "merchant must be"},
		{`{"merchant":"acct_a:b",` + valid + `}`, "merchant must be"},
		{`{"merchant":"cus_1",` + valid + `}`, "merchant must be"},
		{`{"merchant":"acct_` + strings.Repeat("x", 65) + `",` + valid + `}`, "merchant must be"},
		{`{"merchant":"acct_1","amount":0,"currency":"eur","customer":"c","source":"tok_visa"}`, "amount must be"},
		{`{"merchant":"acct_1","amount":1,"currency":"EUR","customer":"c","source":"tok_visa"}`, "currency must be"},
		{`{"merchant":"acct_1","amount":1,"currency":"eur","source":"tok_visa"}`, "Missing required parameter: customer"},
		{`{"merchant":"acct_1","amount":1,"currency":"eur","customer":"c","source":"tok_amex"}`, "source must be"},
		{`{"merchant":"acct_1",` + valid + `,"tip":1}`, "Unknown parameter: tip"},
		{`{"merchant":"acct_1",` + valid + `,"description":"\u0000"}`, "U+0000"},
	} {
		_, err := payments.ParseMessage([]byte(tc.body))
		require.ErrorIs(t, err, payments.ErrInvalidBody, tc.body)
		require.ErrorContains(t, err, tc.want, tc.body)
	}
}
