package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// processAttributes puts a worker in a process group of its own, so that it
// can be killed whole, and has the kernel kill it should this test process
// die first (a panic, a -timeout), so that no worker outlives the run.
func processAttributes() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// stopped reports whether every thread of process pid is stopped by a
// signal (state T in /proc/<pid>/task/*/stat). SIGSTOP returns once the
// signal is queued; a thread running on another CPU may go on for a moment.
func stopped(pid int) (bool, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false, fmt.Errorf("threads of process %d: %v", pid, err)
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		// "tid (comm) S ...": the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("%s: unexpected %q", f, b)
		}
		if b[i+2] != 'T' {
			return false, nil
		}
	}
	return true, nil
}
