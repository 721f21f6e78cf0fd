//go:build unix

package oncetest

import (
	"os"
	"syscall"
)

// The signals that freeze and thaw a server process (RedisServer.Freeze).
var stopSignal, contSignal os.Signal = syscall.SIGSTOP, syscall.SIGCONT
