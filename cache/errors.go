package cache

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable marks a command that failed because Redis, or the cluster
// node holding its key, could not serve it at that moment. Retrying later
// is the remedy; nothing is wrong with the command or the value.
var ErrUnavailable = errors.New("redis unavailable")

// transientReplies are the error replies that say the server cannot serve
// now rather than that the command is wrong: a cluster down or resharding
// (redirections left over after the client's retries), a server loading
// its data, busy with a script, read-only after a failover, out of memory,
// or restarted with an empty script cache.
var transientReplies = []string{"CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "LOADING", "BUSY",
	"MASTERDOWN", "READONLY", "NOREPLICAS", "OOM", "NOSCRIPT"}

// Unavailable reports whether err is about reaching Redis or Redis not
// serving right now (see ErrUnavailable) rather than about one command (a
// script error, a wrong type).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network, timeout, pool, closed client
	}
	msg := rerr.Error()
	for _, p := range transientReplies {
		if strings.HasPrefix(msg, p+" ") || msg == p {
			return true
		}
	}
	return false
}
