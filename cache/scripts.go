package cache

import "github.com/onceonly/onceonly/lua"

// The Redis scripts. Each touches exactly one key (Redis Cluster safe) and
// starts with a header naming its KEYS, ARGV and replies (package lua);
// the shared value decoder is prepended to each so the layout is defined
// once.
var (
	// checkScript is the api's one-round-trip check-or-claim.
	checkScript = lua.Decode + lua.Check
	// applyScript is the versioned write of a Postgres state into the cache.
	applyScript = lua.Decode + lua.Apply
	// releaseScript drops the caller's own provisional claim.
	releaseScript = lua.Decode + lua.Release
)
