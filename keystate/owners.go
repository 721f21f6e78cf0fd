package keystate

import (
	"encoding/binary"
	"sync/atomic"
)

// OwnerSource hands out the owner tokens of an engine's claims: a random
// prefix drawn once per engine and a counter, so a request draws no
// randomness (a replay needs none; a claim needs only a token no other
// claim holds). Two engines share a prefix once in 2^64.
type OwnerSource struct {
	prefix [8]byte
	n      atomic.Uint64
}

// NewOwnerSource returns a source with a fresh random prefix.
func NewOwnerSource() *OwnerSource {
	s := &OwnerSource{}
	seed := NewOwner()
	copy(s.prefix[:], seed[:8])
	s.n.Store(binary.BigEndian.Uint64(seed[8:]))
	return s
}

// Next returns a token no earlier call of this source returned.
func (s *OwnerSource) Next() Owner {
	var o Owner
	copy(o[:8], s.prefix[:])
	binary.BigEndian.PutUint64(o[8:], s.n.Add(1))
	return o
}
