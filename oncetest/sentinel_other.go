//go:build !unix

package oncetest

import "os"

// No signal freezes a process here: RedisServer.Freeze fails the test.
var stopSignal, contSignal os.Signal
