package cache

import "github.com/onceonly/onceonly/keystate"

// Key names. This is the only place that builds a Redis key: every key is
// <prefix><scope>:<key>, and scopes never contain ':' so the split is unique.

// DefaultPrefix is the key prefix when none is configured (REDIS_PREFIX).
const DefaultPrefix = "idem:"

// KeyName returns the Redis key holding the state of ref.
func KeyName(prefix string, ref keystate.Ref) string {
	return prefix + ref.Scope + ":" + ref.Key
}

// SplitKeyName is the inverse of KeyName; ok is false for a key outside the
// prefix or without a scope.
func SplitKeyName(prefix, name string) (ref keystate.Ref, ok bool) {
	if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
		return keystate.Ref{}, false
	}
	rest := name[len(prefix):]
	for i := range len(rest) {
		if rest[i] == ':' {
			if i == 0 || i == len(rest)-1 {
				return keystate.Ref{}, false
			}
			return keystate.Ref{Scope: rest[:i], Key: rest[i+1:]}, true
		}
	}
	return keystate.Ref{}, false
}
