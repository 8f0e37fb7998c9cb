//go:build !linux

package hardening

// DisableDumping does nothing where there is no PR_SET_DUMPABLE: other
// systems guard a process's memory and environment in their own ways
// (on macOS, task_for_pid needs privileges); see docs/exec.md.
func DisableDumping() error { return nil }
