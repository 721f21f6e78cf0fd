package oncetest

import "syscall"

// childAttr makes a server the tests start die with the test binary, even
// when the binary is killed before its cleanups run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
