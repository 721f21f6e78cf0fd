package cache

// Key names. This is the only place that builds a Redis key: every key is
// <prefix><scope>:<key>, and scopes never contain ':' so the split is unique.

// DefaultPrefix is the key prefix when none is configured (REDIS_PREFIX).
const DefaultPrefix = "idem:"

// KeyName returns the Redis key holding the state of (scope, key).
func KeyName(prefix, scope, key string) string {
	return prefix + scope + ":" + key
}

// SplitKeyName is the inverse of KeyName; ok is false for a key outside the
// prefix or without a scope.
func SplitKeyName(prefix, name string) (scope, key string, ok bool) {
	if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
		return "", "", false
	}
	rest := name[len(prefix):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == ':' {
			if i == 0 || i == len(rest)-1 {
				return "", "", false
			}
			return rest[:i], rest[i+1:], true
		}
	}
	return "", "", false
}
