// Package commands is the issuing side of the command channel: stop, pause
// and resume of a task from any process (DESIGN §7).
//
// What it owns: deciding, from the task's state as read, whether a request
// is applied at once or handed to the task's lease holder. A task that no
// node runs is changed directly, by a compare-and-set on its status version
// (queued, scheduled, retrying, pending or paused -> cancelled; scheduled,
// queued or retrying -> paused; paused -> queued); a conflict means the task
// moved meanwhile, and the request is decided again on a fresh read. A task
// that is active (running, stopping, pausing) gets a command row instead;
// the node that holds its lease applies it (package node) and the store
// acknowledges a stop in the same statement that stops the task.
//
// What the database decides: whether the compare-and-set applies, who owns
// the task, and when a command is acknowledged. This package never consumes
// commands: a client that only issues them (the CLI, flotilla.Client) never
// calls store.Store.PendingCommands (DESIGN invariant 8).
//
// Failure: a command whose holder died stays pending; the next holder's
// reconcile honours a pending stop (-> stopped, never retried) and
// acknowledges it. Wait reports a task that finished before its command was
// applied as *TooLateError naming the final state.
package commands
