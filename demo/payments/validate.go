package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Sources the simulated gateway understands.
const (
	SourceVisa         = "tok_visa"
	SourceDeclined     = "tok_chargeDeclined"
	SourceGatewayError = "tok_gatewayError"
	SourceSlow         = "tok_slow"
)

// CreateRequest is a validated POST /v1/payments body.
type CreateRequest struct {
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Source      string  `json:"source"`
	Description *string `json:"description"`
}

// fieldError is a validation failure of one field.
type fieldError struct {
	param, message string
}

func (e *fieldError) Error() string { return e.message }

// notJSONError marks a body that does not parse as JSON.
type notJSONError struct{ err error }

func (e notJSONError) Error() string { return e.err.Error() }

// The parameters of a create body.
const (
	paramAmount      = "amount"
	paramCurrency    = "currency"
	paramCustomer    = "customer"
	paramSource      = "source"
	paramDescription = "description"
)

// parseCreate parses and validates a create body.
func parseCreate(body []byte) (CreateRequest, error) {
	if err := rejectDuplicateNames(body); err != nil {
		return CreateRequest{}, notJSONError{err}
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil {
		if bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) || !json.Valid(body) {
			return CreateRequest{}, notJSONError{err}
		}
		return CreateRequest{}, &fieldError{message: "The request body must be a JSON object."}
	}
	if dec.More() {
		return CreateRequest{}, notJSONError{errors.New("trailing data after the JSON object")}
	}
	if fields == nil {
		return CreateRequest{}, &fieldError{message: "The request body must be a JSON object."}
	}
	return validateFields(fields)
}

// validateFields validates the members of a create body.
func validateFields(fields map[string]json.RawMessage) (CreateRequest, error) {
	var req CreateRequest
	for name, raw := range fields {
		switch name {
		case paramAmount, paramCurrency, paramCustomer, paramSource, paramDescription:
		default:
			return req, &fieldError{param: name, message: "Unknown parameter: " + name + "."}
		}
		if !cleanString(raw) {
			return req, &fieldError{param: name, message: name + " must not hold U+0000, a lone surrogate or invalid UTF-8."}
		}
	}
	amount, ok := fields[paramAmount]
	if !ok {
		return req, &fieldError{paramAmount, "Missing required parameter: amount."}
	}
	n, err := strconv.ParseInt(string(amount), 10, 64)
	if err != nil || n < 1 || n > 99999999 {
		return req, &fieldError{paramAmount, "amount must be an integer from 1 to 99999999 (minor units)."}
	}
	req.Amount = n

	if req.Currency, err = stringField(fields, paramCurrency, true); err != nil {
		return req, err
	}
	if !isCurrency(req.Currency) {
		return req, &fieldError{paramCurrency, "currency must be a lowercase ISO 4217 code such as usd."}
	}
	if req.Customer, err = stringField(fields, paramCustomer, true); err != nil {
		return req, err
	}
	if l := utf8.RuneCountInString(req.Customer); l < 1 || l > 255 {
		return req, &fieldError{paramCustomer, "customer must be 1 to 255 characters."}
	}
	if req.Source, err = stringField(fields, paramSource, true); err != nil {
		return req, err
	}
	switch req.Source {
	case SourceVisa, SourceDeclined, SourceGatewayError, SourceSlow:
	default:
		return req, &fieldError{paramSource, "source must be one of tok_visa, tok_chargeDeclined, tok_gatewayError, tok_slow."}
	}
	if raw, ok := fields[paramDescription]; ok && string(raw) != "null" {
		d, err := stringField(fields, paramDescription, false)
		if err != nil {
			return req, err
		}
		if utf8.RuneCountInString(d) > 1000 {
			return req, &fieldError{paramDescription, "description must be at most 1000 characters."}
		}
		req.Description = &d
	}
	return req, nil
}

func stringField(fields map[string]json.RawMessage, name string, required bool) (string, error) {
	raw, ok := fields[name]
	if !ok {
		if required {
			return "", &fieldError{name, "Missing required parameter: " + name + "."}
		}
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &fieldError{name, name + " must be a string."}
	}
	return s, nil
}

// isoCurrencies lists the active ISO 4217 codes.
var isoCurrencies = func() map[string]bool {
	m := map[string]bool{}
	for c := range strings.FieldsSeq(`aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob
		brl bsd btn bwp byn bzd cad cdf chf clp cny cop crc cuc cup cve czk djf dkk dop dzd egp ern etb eur fjd
		fkp gbp gel ghs gip gmd gnf gtq gyd hkd hnl htg huf idr ils inr iqd irr isk jmd jod jpy kes kgs khr kmf
		kpw krw kwd kyd kzt lak lbp lkr lrd lsl lyd mad mdl mga mkd mmk mnt mop mru mur mvr mwk mxn myr mzn nad
		ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar ron rsd rub rwf sar sbd scr sdg sek sgd shp sle
		sll sos srd ssp stn svc syp szl thb tjs tmt tnd top try ttd twd tzs uah ugx usd uyu uzs ves vnd vuv wst
		xaf xcd xof xpf yer zar zmw zwl`) {
		m[c] = true
	}
	return m
}()

func isCurrency(c string) bool { return isoCurrencies[c] }

// rejectDuplicateNames fails for a JSON document in which an object holds
// the same name twice (compared after unescaping), at any depth: parsers
// disagree on which one wins, so such a body is refused, not guessed at.
func rejectDuplicateNames(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("read JSON: %w", err)
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				name, err := dec.Token()
				if err != nil {
					return fmt.Errorf("read JSON: %w", err)
				}
				key, _ := name.(string)
				if seen[key] {
					return fmt.Errorf("the name %q appears twice in one object", key)
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // }
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ]
		}
		if err != nil {
			return fmt.Errorf("read JSON: %w", err)
		}
		return nil
	}
	return walk()
}

// cleanString reports whether raw, a JSON value, is not a string holding
// U+0000, a lone UTF-16 surrogate (escaped) or invalid UTF-8: encoding/json
// would silently turn the last two into U+FFFD, and Postgres refuses the
// first.
func cleanString(raw []byte) bool {
	if len(raw) < 2 || raw[0] != '"' {
		return true
	}
	if !utf8.Valid(raw) {
		return false
	}
	s := raw[1 : len(raw)-1]
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		r, ok := hex4(s[i+1:])
		if !ok {
			continue
		}
		i += 4 // the last hex digit
		switch {
		case r == 0:
			return false
		case r >= 0xDC00 && r <= 0xDFFF: // a low surrogate with no high one before it
			return false
		case r >= 0xD800 && r <= 0xDBFF: // a high surrogate needs a low one next
			if i+2 >= len(s) || s[i+1] != '\\' || s[i+2] != 'u' {
				return false
			}
			low, ok := hex4(s[i+3:])
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b[:4]), 16, 32)
	if err != nil || n < 0 {
		return 0, false
	}
	return rune(n), true
}
