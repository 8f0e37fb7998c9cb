package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/task"
)

// TestPipelineStopReachesAStepRunningOnAWorker stops a pipeline from the
// command line while one of its steps runs on a `worker run` process: the
// running step is stopped by that process through the command channel
// (written by it), the step waiting for it is cancelled, or skipped when the
// running step's stop came first, and the step that had finished is left as
// it was.
func TestPipelineStopReachesAStepRunningOnAWorker(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low := mustSet(t, "0-31")
	f.worker("run", "--buckets", "0-31", "--node-id", "a")
	f.waitUntilHeld("a", low, startWithin)

	p, err := f.client.SubmitPipeline(t.Context(), flotilla.PipelineRequest{
		Name: "ops", Key: keyIn(t, f.policy, low, "ops"),
		Steps: []task.Step{
			{Name: "first", Kind: "noop"},
			{Name: "long", Kind: "sleep", Payload: []byte(`{"duration":"1h"}`), DependsOn: []task.Dependency{{Step: "first"}}},
			{Name: "after", Kind: "noop", DependsOn: []task.Dependency{{Step: "long"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for _, s := range p.Steps {
		ids[s.Name] = s.Task.ID
	}
	f.waitForTask(ids["long"], "running", func(tk *task.Task) bool { return tk.Status == task.Running })

	stdout, stderr, code := f.cli("pipeline", "stop", fmt.Sprint(p.ID), "--reason", "test")
	if code != 0 {
		t.Fatalf("worker pipeline stop exited %d: %s", code, stderr)
	}
	// The stop goes to after first (dependents first): it is cancelled
	// while pending, then long gets its stop command.
	want := []string{
		fmt.Sprintf("after: task %d: cancelled (was pending)", ids["after"]),
		fmt.Sprintf("long: task %d: stop requested (command", ids["long"]),
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("worker pipeline stop printed %q, want a line for after, then one for long", stdout)
	}
	for i, line := range lines {
		if !strings.HasPrefix(line, want[i]) {
			t.Errorf("line %d is %q, want it to start with %q", i, line, want[i])
		}
	}
	afterEnd := task.Cancelled

	r := f.waitForTask(ids["long"], "stopped", func(tk *task.Task) bool { return tk.Status == task.Stopped })
	var trail []string
	for _, e := range r.Events {
		trail = append(trail, string(e.To))
		if (e.To == task.Stopping || e.To == task.Stopped) && e.Node != "a" {
			t.Errorf("long: %s written by %q, want a, which ran it", e.To, e.Node)
		}
	}
	// The stop's note may cancel the handler before the command is read, and
	// its outcome be written before the move to stopping.
	if got := strings.Join(trail, " -> "); !strings.HasSuffix(got, "running -> stopped") &&
		!strings.HasSuffix(got, "running -> stopping -> stopped") {
		t.Errorf("long's trail %s, want ... running -> stopped or ... running -> stopping -> stopped", got)
	}
	if got := f.mustGet(ids["first"]).Task.Status; got != task.Succeeded {
		t.Errorf("first is %s after the stop, want succeeded as it ended", got)
	}
	if got := f.mustGet(ids["after"]).Task.Status; got != afterEnd {
		t.Errorf("after is %s, want %s", got, afterEnd)
	}

	stdout, stderr, code = f.cli("pipeline", "stop", fmt.Sprint(p.ID))
	if code != 0 || stdout != fmt.Sprintf("pipeline %d: no step to stop\n", p.ID) {
		t.Errorf("a second stop: exit %d, %q %q; want nothing to stop", code, stdout, stderr)
	}
	if _, _, code := f.cli("pipeline", "stop", "999999"); code != 4 {
		t.Errorf("stop of a missing pipeline: exit %d, want 4", code)
	}
	if _, _, code := f.cli("pipeline", "stop", "nope"); code != 2 {
		t.Errorf("stop of a bad id: exit %d, want 2", code)
	}
}
