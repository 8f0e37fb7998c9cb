package reconcile

import (
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A dry run moves nothing, writes no event, and foretells what the rescue
// then does.
func TestADryRunChangesNothingAndSaysWhatTheRescueWillDo(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 1)
	retry := b.running(t, owner, held, 1, 3)
	last := b.running(t, owner, held, 1, 1)
	stopPending := b.running(t, owner, held, 1, 3)
	issueStop(t, b, owner, stopPending)
	stopping := b.running(t, owner, held, 1, 3)
	moveTo(task.Stopping)(t, b, owner, stopping)
	tasks := []*task.Task{retry, last, stopPending, stopping}
	b.expire(t, tasks...)
	before := map[int64]*task.Task{}
	events := map[int64]int{}
	for _, tk := range tasks {
		before[tk.ID] = b.get(t, tk.ID)
		events[tk.ID] = len(b.events(t, tk.ID))
	}

	dry, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held, Backoff: testBackoff, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]task.Status{
		retry.ID: task.Retrying, last.ID: task.Lost, stopPending.ID: task.Stopped, stopping.ID: task.Stopped,
	}
	if !dry.DryRun || dry.Retried != 1 || dry.Lost != 1 || dry.Stopped != 2 || dry.More {
		t.Errorf("dry run report %+v", dry)
	}
	for id, status := range want {
		if e := entryFor(t, dry, id); e.To != status || e.From != before[id].Status {
			t.Errorf("dry run: task %d from %s to %s, want to %s", id, e.From, e.To, status)
		}
		b.unchanged(t, before[id])
		if n := len(b.events(t, id)); n != events[id] {
			t.Errorf("dry run wrote %d events for task %d", n-events[id], id)
		}
	}
	if e := entryFor(t, dry, retry.ID); e.Delay != testBackoff(1) {
		t.Errorf("dry run delay %v, want %v", e.Delay, testBackoff(1))
	}

	rescued := b.rescue(t, b.store, owner, held)
	for id, status := range want {
		if e := entryFor(t, rescued, id); e.To != status || b.get(t, id).Status != status {
			t.Errorf("rescue: task %d went to %s (report %s), the dry run said %s", id, b.get(t, id).Status, e.To, status)
		}
	}
}

// A dry run looks at one page: nothing moves, so the next would be the
// same. It says when there is more.
func TestADryRunSaysWhenThereIsMoreThanAPage(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 2)
	for range 3 {
		b.expire(t, b.running(t, owner, held, 2, 3))
	}
	rep, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held, Limit: 2, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Entries) != 2 || !rep.More || rep.Passes != 1 {
		t.Errorf("report %+v, want 2 entries, More, one pass", rep)
	}
	if got, _ := b.store.ListTasks(b.ctx, store.TaskFilter{Statuses: []task.Status{task.Running}}); len(got) != 3 {
		t.Errorf("%d tasks still running after a dry run, want 3", len(got))
	}
}
