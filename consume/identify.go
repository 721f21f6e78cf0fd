package consume

import (
	"errors"
	"fmt"

	"github.com/onceonly/onceonly"
)

// Identity is what identifies a message to the engine.
type Identity struct {
	// Scope and Key name the message's key.
	Scope, Key string
	// Payload is what the key's first execution is compared with, and
	// what the handler gets.
	Payload []byte
}

// Identifier takes a message's Identity from a broker message M: the
// package's Options.Scope, ScopeOf, Key and Payload, and the body a
// message's payload is by default.
type Identifier[M any] struct {
	// Scope is every message's scope unless ScopeOf is set.
	Scope string
	// ScopeOf, when set, takes the scope from each message.
	ScopeOf func(m M) (string, error)
	// Key returns the message's idempotency key (required).
	Key func(m M) (string, error)
	// Payload, when set, returns the message's payload; Body otherwise.
	Payload func(m M) ([]byte, error)
	// Body is the payload by default (required).
	Body func(m M) []byte
}

// CheckScope returns an error wrapping onceonly.ErrInvalidScope when a
// fixed scope (no ScopeOf) would make every message invalid; a broker
// package calls it at construction.
func (i Identifier[M]) CheckScope() error {
	if i.ScopeOf == nil && i.Scope != "" && onceonly.ValidateScope(i.Scope) != nil {
		return fmt.Errorf("Options.Scope %q: %w", i.Scope, onceonly.ErrInvalidScope)
	}
	return nil
}

// Identify returns the Identity m carries. An error wraps
// onceonly.ErrInvalidMessage (or onceonly.ErrInvalidKey), which
// SettlePolicy.Settle reads as invalid, so that the message is
// dead-lettered before the engine sees it and leaves no key.
//
// A panic in Key, ScopeOf or Payload is such an error too, wrapping a
// *PanicError: they depend on the message alone, so it would panic again on
// every redelivery.
func (i Identifier[M]) Identify(m M) (id Identity, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Invalid("identify", &PanicError{Value: p})
		}
	}()
	id = Identity{Scope: i.Scope}
	if id.Key, err = i.Key(m); err != nil {
		return id, Invalid("key", err)
	}
	if err := onceonly.ValidateKey(id.Key); err != nil {
		return id, fmt.Errorf("key %q: %w", id.Key, err)
	}
	if i.ScopeOf != nil {
		if id.Scope, err = i.ScopeOf(m); err != nil {
			return id, Invalid("scope", err)
		}
	}
	if i.Payload != nil {
		if id.Payload, err = i.Payload(m); err != nil {
			return id, Invalid("payload", err)
		}
	} else {
		id.Payload = i.Body(m)
	}
	return id, nil
}

// Invalid wraps err, an error of taking the message's what (key, scope,
// payload), in onceonly.ErrInvalidMessage, so that Settle dead-letters the
// message as invalid; once only, when err wraps it already.
func Invalid(what string, err error) error {
	if errors.Is(err, onceonly.ErrInvalidMessage) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", onceonly.ErrInvalidMessage, what, err)
}

// PanicError is the error of a recovered panic.
type PanicError struct {
	// Value is what was passed to panic.
	Value any
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v", p.Value) }
