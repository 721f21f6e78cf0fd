// Package lua embeds the Redis scripts of the cache. Each script touches
// exactly one key (Redis Cluster safe) and starts with a header naming its
// KEYS, ARGV and replies; decode.lua, the shared value decoder, is prepended
// to each so the layout is defined once.
package lua

import (
	_ "embed"
)

//go:embed decode.lua
var decode string

//go:embed check.lua
var check string

//go:embed apply.lua
var apply string

//go:embed release.lua
var release string

// Check is the api's one-round-trip check-or-claim script.
var Check = decode + check

// Apply is the versioned write of a Postgres state into the cache.
var Apply = decode + apply

// Release drops the caller's own provisional claim.
var Release = decode + release
