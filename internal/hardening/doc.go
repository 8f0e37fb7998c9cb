// Package hardening holds what a node does to itself at start so that the
// programs it runs cannot take its secrets.
//
// The exec kind runs children as the node's user unless the operator names
// another (--exec-user). A process of the same uid may read another's
// /proc/<pid>/environ and /proc/<pid>/mem, and attach to it with ptrace,
// as long as the target is dumpable: that is how a child could read the
// node's FLOTILLA_DSN, password included. A non-dumpable process can be
// read that way only by a holder of CAP_SYS_PTRACE (in practice, root
// with its full capabilities), so DisableDumping closes the path to every
// child that is not root.
//
// Clearing the variable from the node's environment (os.Unsetenv) is not
// enough on its own: /proc/<pid>/environ shows the environment the process
// was started with, whatever it changes later.
package hardening
