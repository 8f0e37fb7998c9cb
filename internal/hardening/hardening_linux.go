package hardening

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// DisableDumping makes the process non-dumpable (prctl PR_SET_DUMPABLE 0):
// processes of the same uid without CAP_SYS_PTRACE can no longer read its
// /proc/<pid>/environ or /proc/<pid>/mem, nor attach to it, and it leaves
// no core dump. Children are not affected: execve makes a process dumpable
// again.
func DisableDumping() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}

// Dumpable reports whether the process is dumpable.
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return false, fmt.Errorf("prctl(PR_GET_DUMPABLE): %w", err)
	}
	return v != 0, nil
}
