// Package lua holds onceonly's Redis scripts, embedded. Each script touches
// exactly one key, so every one of them runs on Redis Cluster, and opens with
// a header naming its KEYS, ARGV and replies. Decode, the shared decoder of
// the cache value's layout, is not a script of its own: it is prepended to
// each of the others, so the layout is defined once.
//
// Package cache runs these scripts; a program that writes its own cache
// client reads them here; the value layout they parse is the one package
// cache encodes (see cache.Entry).
package lua

import _ "embed"

var (
	// Decode defines the Lua functions that parse a cache value
	// (decode.lua). It is prepended to every script below.
	//
	//go:embed decode.lua
	Decode string

	// Check is the api's one round trip: it answers a replay, a conflict or
	// a reused key from the cache, or records a provisional claim
	// (check.lua).
	//
	//go:embed check.lua
	Check string

	// Apply writes a state committed in Postgres into the cache, refusing
	// to go back in version (apply.lua).
	//
	//go:embed apply.lua
	Apply string

	// Release drops the caller's own provisional claim (release.lua).
	//
	//go:embed release.lua
	Release string
)
