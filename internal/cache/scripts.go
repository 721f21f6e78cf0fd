package cache

import (
	_ "embed"
)

// The Redis scripts. Each touches exactly one key (Redis Cluster safe) and
// starts with a header naming its KEYS, ARGV and replies; lua/decode.lua,
// the shared value decoder, is prepended to each so the layout is defined
// once.
var (
	//go:embed lua/decode.lua
	decodeLua string
	//go:embed lua/check.lua
	checkLua string
	//go:embed lua/apply.lua
	applyLua string
	//go:embed lua/release.lua
	releaseLua string

	// checkScript is the api's one-round-trip check-or-claim.
	checkScript = decodeLua + checkLua
	// applyScript is the versioned write of a Postgres state into the cache.
	applyScript = decodeLua + applyLua
	// releaseScript drops the caller's own provisional claim.
	releaseScript = decodeLua + releaseLua
)
