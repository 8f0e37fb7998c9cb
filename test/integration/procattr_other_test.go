//go:build !linux

package integration

import "syscall"

// processAttributes puts a worker in a process group of its own, so that it
// can be killed whole. Only Linux can also tie the worker's life to this
// process; elsewhere the cleanups are what kill it.
func processAttributes() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// stopped reports whether process pid is stopped by a signal. Only Linux
// can tell (procattr_linux_test.go); elsewhere SIGSTOP is taken to have
// stopped it once sent.
func stopped(int) (bool, error) { return true, nil }
