package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/onceonly/onceonly/keystate"
)

// ErrKeyBusy is returned by a claim whose key's lock another transaction
// holds: an execution of the key is under way (a one-commit execution
// whose row is not committed yet, or another claim).
var ErrKeyBusy = errors.New("the key is held by another execution")

// keyBusy is the SQLSTATE of onceonly_key_busy.
const keyBusy = "OO002"

// busyOnState returns ErrKeyBusy for err the SQLSTATE of a key whose lock
// another transaction holds, else err.
func busyOnState(err error) error {
	if sqlState(err) == keyBusy {
		return fmt.Errorf("%w: %w", ErrKeyBusy, err)
	}
	return err
}

// LoadLockSecret reads the database's key lock secret
// (idempotency_lock_secret, made by the key_locks migration), once: every
// key's lock id is derived from it (LockID). It costs nothing once loaded.
func (s *Store) LoadLockSecret(ctx context.Context, db Querier) error {
	if s.lockSecret.Load() != nil {
		return nil
	}
	var secret []byte
	if err := lockSecretSQL.queryRow(ctx, db, nil).Scan(&secret); err != nil {
		return fmt.Errorf("read the key lock secret (are the migrations applied?): %w", err)
	}
	s.lockSecret.CompareAndSwap(nil, &secret)
	return nil
}

// LockID returns the id of ref's lock: the first 32 bits of
// SHA-256(secret || scope ':' key), as onceonly_key_lock_id computes it in
// Postgres. The secret must be loaded (LoadLockSecret); without it LockID
// panics, a bug of the caller.
func (s *Store) LockID(ref keystate.Ref) int32 {
	secret := s.lockSecret.Load()
	if secret == nil {
		panic("keystore: LockID before LoadLockSecret")
	}
	h := sha256.New()
	h.Write(*secret)
	h.Write([]byte(ref.Scope))
	h.Write([]byte{':'})
	h.Write([]byte(ref.Key))
	var sum [sha256.Size]byte
	return int32(binary.BigEndian.Uint32(h.Sum(sum[:0]))) //nolint:gosec // the bits as Postgres reads them: bit(32)::integer
}
