package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/task"
)

// TestStopFromAThirdProcess stops a task running on one worker with
// `worker stop --wait` from another process: the command reaches the task's
// holder, which cancels the handler on the command's notification, and the
// trail reads running -> stopped (or running -> stopping -> stopped when the
// command was read before the handler's outcome was written), written by
// that holder. Tasks that no node runs are
// changed at once; finished and missing tasks get exit statuses 5 and 4.
func TestStopFromAThirdProcess(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-62")
	// Bucket 63 is nobody's: tasks there wait, for the direct changes.
	f.worker("run", "--buckets", "0-31", "--node-id", "a")
	f.worker("run", "--buckets", "32-62", "--node-id", "b")
	f.waitUntilHeld("a", low, startWithin)
	f.waitUntilHeld("b", high, startWithin)

	id := f.submit("--kind", "sleep", "--key", keyIn(t, f.policy, low, "sleepy"), "--payload", `{"duration":"1h"}`)
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })

	stdout, stderr, code := f.cli("stop", fmt.Sprint(id), "--wait", "--reason", "test")
	if code != 0 {
		t.Fatalf("worker stop --wait exited %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "stopped") || !strings.Contains(stdout, "node a") {
		t.Errorf("worker stop --wait printed %q, want the outcome naming node a", stdout)
	}
	r := f.mustGet(id)
	if r.Task.Status != task.Stopped {
		t.Fatalf("after stop --wait: %s", describeTask(r))
	}
	var trail []string
	for _, e := range r.Events {
		trail = append(trail, string(e.To))
		if (e.To == task.Stopping || e.To == task.Stopped) && e.Node != "a" {
			t.Errorf("%s written by %q, want a, which ran the task", e.To, e.Node)
		}
	}
	if got := strings.Join(trail, " -> "); !strings.HasSuffix(got, "running -> stopped") && !strings.HasSuffix(got, "running -> stopping -> stopped") {
		t.Errorf("trail %s, want ... running -> stopped or ... running -> stopping -> stopped", got)
	}
	// The handler itself saw the cancellation and returned: the stop was
	// recorded from its outcome, not by abandoning it after the grace.
	if last := r.Events[len(r.Events)-1]; !strings.HasSuffix(last.Reason, "stopped on request") {
		t.Errorf("the stop was recorded with reason %q, want it to end %q (the handler returned on its cancellation)",
			last.Reason, "stopped on request")
	}
	// Whichever came first, the stop's note or its command, the trail says
	// who asked and why.
	named := false
	for _, e := range r.Events {
		named = named || (strings.Contains(e.Reason, "stop requested by ") && strings.Contains(e.Reason, ": test"))
	}
	if !named {
		t.Errorf("no event of the trail names who stopped the task and why: %s", describeTask(r))
	}

	// A queued task nobody serves is cancelled at once, no node involved.
	unheld := mustSet(t, "63")
	queued := f.submit("--kind", "noop", "--key", keyIn(t, f.policy, unheld, "idle"), "--allow-unowned")
	stdout, stderr, code = f.cli("stop", fmt.Sprint(queued), "--wait", "--json")
	if code != 0 || !strings.Contains(stdout, `"cancelled"`) {
		t.Errorf("worker stop of a queued task: exit %d, %s %s; want cancelled", code, stdout, stderr)
	}
	if got := f.mustGet(queued).Task.Status; got != task.Cancelled {
		t.Errorf("stopped queued task is %s, want cancelled", got)
	}

	// Pause and resume of a task that waits.
	waiting := f.submit("--kind", "noop", "--key", keyIn(t, f.policy, unheld, "wait"), "--allow-unowned")
	if _, stderr, code := f.cli("pause", fmt.Sprint(waiting)); code != 0 {
		t.Fatalf("worker pause exited %d: %s", code, stderr)
	}
	if got := f.mustGet(waiting).Task.Status; got != task.Paused {
		t.Errorf("paused task is %s", got)
	}
	if _, stderr, code := f.cli("resume", fmt.Sprint(waiting)); code != 0 {
		t.Fatalf("worker resume exited %d: %s", code, stderr)
	}
	if got := f.mustGet(waiting).Task.Status; got != task.Queued {
		t.Errorf("resumed task is %s, want queued", got)
	}
	if _, stderr, code := f.cli("resume", fmt.Sprint(waiting)); code != 3 || !strings.Contains(stderr, "queued") {
		t.Errorf("resume of a queued task: exit %d, %q; want 3 naming its state", code, stderr)
	}

	// Too late, and nothing there.
	done := f.submit("--kind", "noop", "--key", keyIn(t, f.policy, high, "quick"))
	f.waitForTask(done, "succeeded", succeeded)
	if _, stderr, code := f.cli("stop", fmt.Sprint(done), "--wait"); code != 5 || !strings.Contains(stderr, "succeeded") {
		t.Errorf("stop of a finished task: exit %d, %q; want 5 naming succeeded", code, stderr)
	}
	if _, stderr, code := f.cli("stop", "999999"); code != 4 {
		t.Errorf("stop of a missing task: exit %d, %q; want 4", code, stderr)
	}
	if _, _, code := f.cli("stop", "nope"); code != 2 {
		t.Errorf("stop of a bad id: exit %d, want 2", code)
	}
}
