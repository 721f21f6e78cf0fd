package daemon

import "github.com/redis/go-redis/v9/logging"

func init() { //nolint:gochecknoinits // must run before any command opens a Redis client, whatever its entry point
	// go-redis logs dial failures through the standard log package, outside
	// slog; the commands count and log Redis failures themselves.
	logging.Disable()
}
