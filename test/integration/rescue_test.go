package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// killHolderWhileRunning starts a holder of buckets 0-31 and a standby for
// them, submits a sleep task with maxAttempts into those buckets, waits
// until the holder runs it, and kills the holder with SIGKILL. It returns
// the task as it was seen running on the holder, before the kill.
func killHolderWhileRunning(t *testing.T, f *fleet, maxAttempts int) *task.Task {
	t.Helper()
	low := mustSet(t, "0-31")
	holder := f.worker("run", "--buckets", "0-31", "--node-id", "holder", "--bucket-lease-ttl", leaseTTL(2*time.Second).String(), "--no-balance")
	f.waitUntilHeld("holder", low, startWithin)
	f.worker("run", "--buckets", "0-31", "--node-id", "standby", "--bucket-lease-ttl", leaseTTL(2*time.Second).String(), "--no-balance")
	f.waitUntilStandingBy("standby", low)

	// Long enough that the holder cannot finish before it is killed, short
	// enough that the standby's retry of it keeps the test short.
	id := f.submit("--kind", "sleep", "--key", keyIn(t, f.policy, low, "rescue"),
		"--payload", `{"duration":"5s"}`, "--max-attempts", fmt.Sprint(maxAttempts))
	running := f.waitForTask(id, "running on holder", func(tk *task.Task) bool {
		return tk.Status == task.Running && tk.Node == "holder"
	}).Task
	holder.kill9()
	return running
}

// trailOf is a task's audit trail as its states: "queued running succeeded".
func trailOf(events []task.Event) string {
	states := make([]string, len(events))
	for i, e := range events {
		states[i] = string(e.To)
	}
	return strings.Join(states, " ")
}

// TestAStandbyRescuesTheTaskOfAKilledHolder is invariant 3 across
// processes: the holder is killed with SIGKILL while it runs a task; the
// standby that takes its buckets rescues the task at once (it was claimed
// under the old epoch, its task lease still running) and runs it again to
// success. Nothing after the kill is written by the holder.
func TestAStandbyRescuesTheTaskOfAKilledHolder(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	running := killHolderWhileRunning(t, f, 3)
	if running.Attempt != 1 || running.Owner == "" {
		t.Fatalf("the holder ran attempt %d as %q, want attempt 1 under its incarnation", running.Attempt, running.Owner)
	}

	report := f.waitForTask(running.ID, "succeeded", succeeded)
	done := report.Task
	if done.Node != "standby" || done.Attempt != 2 || done.Epoch != running.Epoch+1 {
		t.Errorf("succeeded on %q at attempt %d under epoch %d, want standby, attempt 2, epoch %d",
			done.Node, done.Attempt, done.Epoch, running.Epoch+1)
	}

	events := report.Events
	if trail := trailOf(events); trail != "queued running retrying running succeeded" {
		t.Fatalf("trail %q, want queued running retrying running succeeded", trail)
	}
	claimed, rescued, again, finished := events[1], events[2], events[3], events[4]
	if claimed.Node != "holder" || claimed.Epoch != running.Epoch || claimed.Attempt != 1 {
		t.Errorf("claim event %+v, want attempt 1 by holder under epoch %d", claimed, running.Epoch)
	}
	// The reason names the killed incarnation, and the older epoch: the
	// rescue did not wait for the task lease to run out.
	if rescued.Node != "standby" || rescued.Epoch != running.Epoch+1 || rescued.Attempt != 1 ||
		!strings.Contains(rescued.Reason, running.Owner) || !strings.Contains(rescued.Reason, "under epoch") {
		t.Errorf("rescue event %+v, want attempt 1 retried by standby under epoch %d, naming %s and its epoch",
			rescued, running.Epoch+1, running.Owner)
	}
	if again.Node != "standby" || again.Epoch != running.Epoch+1 || again.Attempt != 2 {
		t.Errorf("second claim %+v, want attempt 2 by standby under epoch %d", again, running.Epoch+1)
	}
	if finished.Node != "standby" {
		t.Errorf("success event %+v, want it by standby", finished)
	}
	noEventByTheHolderAfter(t, events, running.StatusVersion)
}

// TestAKilledHoldersTaskOnItsLastAttemptIsLost: the same kill with no
// attempt left ends the task lost, by the standby, never running again.
func TestAKilledHoldersTaskOnItsLastAttemptIsLost(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	running := killHolderWhileRunning(t, f, 1)

	report := f.waitForTask(running.ID, "lost", func(tk *task.Task) bool { return tk.Status == task.Lost })
	events := report.Events
	if trail := trailOf(events); trail != "queued running lost" {
		t.Fatalf("trail %q, want queued running lost", trail)
	}
	if lost := events[2]; lost.Node != "standby" || lost.Epoch != running.Epoch+1 ||
		!strings.Contains(lost.Reason, running.Owner) {
		t.Errorf("loss event %+v, want it by standby under epoch %d, naming %s", lost, running.Epoch+1, running.Owner)
	}
	if got := report.Task; got.Attempt != 1 || got.Error == "" {
		t.Errorf("lost at attempt %d with error %q, want attempt 1 and why", got.Attempt, got.Error)
	}
	noEventByTheHolderAfter(t, events, running.StatusVersion)
}

// noEventByTheHolderAfter fails the test if an event after sequence seq,
// the last one before the kill, was written by the killed holder.
func noEventByTheHolderAfter(t *testing.T, events []task.Event, seq int64) {
	t.Helper()
	for _, e := range events {
		if e.Seq > seq && e.Node == "holder" {
			t.Errorf("event %d (%s -> %s) was written by the killed holder: %+v", e.Seq, e.From, e.To, e)
		}
	}
}
