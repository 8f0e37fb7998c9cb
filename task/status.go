package task

import (
	"fmt"
	"sort"
	"strings"
)

// Status is the state of a task. The string form is what the database stores
// and what the CLI prints.
type Status string

// The fifteen states. See DESIGN §4.
const (
	Pending   Status = "pending"   // waits for its pipeline parents
	Scheduled Status = "scheduled" // waits for run_at
	Queued    Status = "queued"    // ready; waits for its bucket's holder
	Running   Status = "running"   // leased by a node, handler executing
	Stopping  Status = "stopping"  // stop requested while running; handler's context cancelled
	Pausing   Status = "pausing"   // pause requested; handler asked to checkpoint
	Paused    Status = "paused"    // checkpointed or paused before it ran; holds no lease
	Retrying  Status = "retrying"  // an attempt failed, timed out or was lost; waits for backoff

	Succeeded Status = "succeeded"
	Failed    Status = "failed"
	TimedOut  Status = "timed_out"
	Stopped   Status = "stopped"   // interrupted while running
	Cancelled Status = "cancelled" // stopped before it ever ran (or while paused/queued)
	Lost      Status = "lost"      // its lease expired and no attempt was left
	Skipped   Status = "skipped"   // a pipeline parent did not succeed
)

// transitions is the whole state machine: the states each state may move to.
// Terminal states have no entry.
var transitions = map[Status][]Status{
	// A pending step is paused with its pipeline and keeps its count of
	// dependencies left; one that ends in a way its policy refuses skips
	// it while paused, as it would while pending.
	Pending:   {Queued, Scheduled, Skipped, Cancelled, Paused},
	Scheduled: {Running, Paused, Cancelled},
	Queued:    {Running, Paused, Cancelled},
	// Running may end paused: an attempt that ends with a retry or a
	// release while a pause is pending is paused, not run again.
	Running:  {Succeeded, Failed, TimedOut, Retrying, Stopping, Pausing, Stopped, Lost, Queued, Paused},
	Stopping: {Stopped, Succeeded},
	// Pausing may end stopped as well: a stop that arrives while a pause
	// is pending wins over the pause, and over a retry or a loss found by
	// reconcile, exactly as it does from running.
	Pausing: {Paused, Succeeded, Failed, TimedOut, Retrying, Lost, Stopping, Stopped},
	// A resumed task whose run_at is still ahead (it was paused while it
	// waited for its delay or its retry's backoff) is scheduled, not queued;
	// a pipeline step paused while it waited for dependencies that have not
	// all ended goes back to pending (ResumeDestination).
	Paused:   {Queued, Scheduled, Cancelled, Pending, Skipped},
	Retrying: {Running, Paused, Cancelled},
}

// All lists the fifteen states in the order of DESIGN §4.
func All() []Status {
	return []Status{
		Pending, Scheduled, Queued, Running, Stopping, Pausing, Paused, Retrying,
		Succeeded, Failed, TimedOut, Stopped, Cancelled, Lost, Skipped,
	}
}

// Valid reports whether s is one of the fifteen states.
func (s Status) Valid() bool {
	for _, known := range All() {
		if s == known {
			return true
		}
	}
	return false
}

// Terminal reports whether s never changes again.
func (s Status) Terminal() bool {
	return s.Valid() && len(transitions[s]) == 0
}

// Active reports whether a task in state s holds a task lease: a handler may
// be executing it, and every write about it is fenced by claim_seq, owner and
// bucket epoch. Reconcile rescues tasks in these states.
func (s Status) Active() bool {
	return s == Running || s == Stopping || s == Pausing
}

// Claimable reports whether a task in state s can be claimed once its run_at
// has passed. Queued tasks are due at once (their run_at is their submit time).
func (s Status) Claimable() bool {
	return s == Queued || s == Scheduled || s == Retrying
}

// CanTransition reports whether the table allows moving from one state to
// another. A state never transitions to itself.
func CanTransition(from, to Status) bool {
	for _, next := range transitions[from] {
		if next == to {
			return true
		}
	}
	return false
}

// Next lists the states that from may move to, in table order.
func Next(from Status) []Status {
	return append([]Status(nil), transitions[from]...)
}

// TerminalStates lists the states that never change again.
func TerminalStates() []Status {
	var out []Status
	for _, s := range All() {
		if s.Terminal() {
			out = append(out, s)
		}
	}
	return out
}

// ParseStatus turns user input into a Status, naming the valid ones when it
// is not one.
func ParseStatus(s string) (Status, error) {
	st := Status(strings.TrimSpace(strings.ToLower(s)))
	if st.Valid() {
		return st, nil
	}
	names := make([]string, 0, 15)
	for _, known := range All() {
		names = append(names, string(known))
	}
	sort.Strings(names)
	return "", fmt.Errorf("unknown task status %q: valid statuses are %s", s, strings.Join(names, ", "))
}

// TransitionError says that the state machine does not allow a move.
type TransitionError struct {
	ID       int64
	From, To Status
}

func (e *TransitionError) Error() string {
	next := Next(e.From)
	if len(next) == 0 {
		return fmt.Sprintf("task %d is %s, a final state: it cannot become %s", e.ID, e.From, e.To)
	}
	names := make([]string, len(next))
	for i, s := range next {
		names[i] = string(s)
	}
	return fmt.Sprintf("task %d cannot go from %s to %s: from %s it can go to %s",
		e.ID, e.From, e.To, e.From, strings.Join(names, ", "))
}
