package integration

import "syscall"

// processAttributes puts a worker in a process group of its own, so that it
// can be killed whole, and has the kernel kill it should this test process
// die first (a panic, a -timeout), so that no worker outlives the run.
func processAttributes() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
