package kinds

import (
	"os/exec"
	"syscall"
	"unsafe"
)

func init() {
	tieToNode = func(attr *syscall.SysProcAttr) {
		// The signal comes when the thread that started the child ends.
		// Go ends a thread only when a goroutine exits while locked to it,
		// which the handler never does, so in practice this is the node's
		// death.
		attr.Pdeathsig = syscall.SIGKILL
	}
	awaitExit = awaitExitUnreaped
}

// pidType is P_PID of waitid(2): wait for the process with this pid.
const pidType = 1

// awaitExitUnreaped blocks until the child has exited and leaves it a
// zombie (WNOWAIT), so that its pid, which names its process group, stays
// taken until the group has been killed and Cmd.Wait reaps it. Should
// waitid fail, it falls back to Cmd.Wait.
func awaitExitUnreaped(cmd *exec.Cmd) (reaped bool, err error) {
	var siginfo [16]uint64 // siginfo_t is 128 bytes; its content is not needed
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pidType, uintptr(cmd.Process.Pid),
			uintptr(unsafe.Pointer(&siginfo[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return false, nil
		case syscall.EINTR:
			continue
		default:
			return true, cmd.Wait()
		}
	}
}
