package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	onceonly "github.com/onceonly/onceonly"
)

// ErrInvalidBody is returned for a create body or a payment message that
// does not validate; its message says why, naming the field.
var ErrInvalidBody = errors.New("payments: invalid body")

// paramMerchant is the member of a payment message that names its
// merchant.
const paramMerchant = "merchant"

// merchantPattern is what a merchant id looks like: acct_ then 1 to 64
// letters, digits or underscores (no ':', so it is a valid scope).
var merchantPattern = regexp.MustCompile(`^acct_[A-Za-z0-9_]{1,64}$`)

// Message is a payment command as a broker carries it (docs/consumers.md):
// the JSON body of POST /v1/payments with one more member,
// "merchant", the scope of its idempotency key.
type Message struct {
	// Merchant is the merchant the payment is for: the key's scope, as an
	// API key's merchant is for the HTTP API.
	Merchant string
	// Payload is the canonical JSON (members sorted, no whitespace) of the
	// body without "merchant": what the key's first execution is compared
	// with, so two copies that differ in whitespace or member order are one
	// message, and what Payer.Pay takes as the body.
	Payload []byte
}

// ParseMessage validates a payment message's body as POST /v1/payments
// validates a request's (the same rules, the same messages), plus its
// merchant, and returns the message. Every error wraps ErrInvalidBody: a
// message that fails can never run, and is dead-lettered without claiming
// its key.
func ParseMessage(body []byte) (Message, error) {
	if err := rejectDuplicateNames(body); err != nil {
		return Message{}, fmt.Errorf("%w: not JSON: %w", ErrInvalidBody, err)
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return Message{}, fmt.Errorf("%w: the message must be a JSON object", ErrInvalidBody)
	}
	if dec.More() {
		return Message{}, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidBody)
	}
	raw, ok := fields[paramMerchant]
	if !ok {
		return Message{}, fmt.Errorf("%w: missing required parameter: merchant", ErrInvalidBody)
	}
	var merchant string
	if err := json.Unmarshal(raw, &merchant); err != nil || !merchantPattern.MatchString(merchant) {
		return Message{}, fmt.Errorf("%w: merchant must be acct_ then 1 to 64 letters, digits or underscores", ErrInvalidBody)
	}
	delete(fields, paramMerchant)
	if _, err := validateFields(fields); err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrInvalidBody, err)
	}
	rest, err := json.Marshal(fields)
	if err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrInvalidBody, err)
	}
	payload, err := onceonly.CanonicalJSON(rest)
	if err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrInvalidBody, err)
	}
	return Message{Merchant: merchant, Payload: payload}, nil
}
