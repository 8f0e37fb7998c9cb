package storetest

import (
	"errors"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func events(b *testBundle, id int64) []task.Event {
	b.t.Helper()
	evs, err := b.s.TaskEvents(b.ctx, id)
	if err != nil {
		b.t.Fatalf("TaskEvents(%d): %v", id, err)
	}
	return evs
}

// checkTrail asserts that a task's audit trail is complete and ordered:
// sequence 1..n, each event starting where the previous one ended, every step
// allowed by the table, ending at the task's current state and version.
func checkTrail(b *testBundle, id int64) []task.Event {
	b.t.Helper()
	evs := events(b, id)
	cur := b.get(id)
	if int64(len(evs)) != cur.StatusVersion {
		b.t.Fatalf("task %d at status_version %d has %d events", id, cur.StatusVersion, len(evs))
	}
	for i, ev := range evs {
		if ev.TaskID != id || ev.Seq != int64(i+1) {
			b.t.Fatalf("event %d: task %d seq %d", i, ev.TaskID, ev.Seq)
		}
		if i == 0 {
			if ev.From != "" {
				b.t.Errorf("creation event comes from %q", ev.From)
			}
			continue
		}
		prev := evs[i-1]
		if ev.From != prev.To || !task.CanTransition(ev.From, ev.To) {
			b.t.Errorf("event %d: %s -> %s after %s", ev.Seq, ev.From, ev.To, prev.To)
		}
		if ev.At.Before(prev.At) {
			b.t.Errorf("event %d at %v is before event %d at %v", ev.Seq, ev.At, prev.Seq, prev.At)
		}
	}
	if last := evs[len(evs)-1]; last.To != cur.Status {
		b.t.Errorf("trail ends at %s, task is %s", last.To, cur.Status)
	}
	return evs
}

func testAudit(t *testing.T, h Harness) {
	t.Run("EveryTransitionIsRecorded", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
		held := b.hold("a", 1)

		c := b.claim("a", held, 1)[0]
		b.advance("a", store.ActiveTransition{Ref: c.Ref(), To: task.Pausing, Reason: "pause requested"})
		b.advance("a", store.ActiveTransition{Ref: c.Ref(), To: task.Paused, Reason: "checkpoint"})
		paused := b.get(created.ID)
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: paused.StatusVersion, To: task.Queued, Reason: "resume", Node: "cli"}); err != nil {
			t.Fatal(err)
		}
		c = b.claim("a", held, 1)[0]
		b.advance("a", store.ActiveTransition{Ref: c.Ref(), To: task.Retrying, Error: "boom"})
		c = b.claim("a", held, 1)[0]
		b.advance("a", store.ActiveTransition{Ref: c.Ref(), To: task.Stopping, Reason: "stop requested"})
		b.advance("a", store.ActiveTransition{Ref: c.Ref(), To: task.Stopped, Reason: "handler returned"})

		evs := checkTrail(b, created.ID)
		want := []task.Status{task.Queued, task.Running, task.Pausing, task.Paused, task.Queued, task.Running,
			task.Retrying, task.Running, task.Stopping, task.Stopped}
		if len(evs) != len(want) {
			t.Fatalf("%d events, want %d: %+v", len(evs), len(want), evs)
		}
		for i, s := range want {
			if evs[i].To != s {
				t.Errorf("event %d to %s, want %s", i+1, evs[i].To, s)
			}
		}
		if evs[0].Reason == "" {
			t.Error("the creation event has no reason")
		}
		if ev := evs[1]; ev.Node != "node-a" || ev.Epoch != held[0].Epoch || ev.Attempt != 1 {
			t.Errorf("claim event: node %q epoch %d attempt %d", ev.Node, ev.Epoch, ev.Attempt)
		}
		if ev := evs[4]; ev.Reason != "resume" || ev.Node != "cli" {
			t.Errorf("resume event: %+v", ev)
		}
		if ev := evs[6]; ev.Error != "boom" || ev.Attempt != 2 {
			t.Errorf("retry event: error %q attempt %d; want boom, attempt 2", ev.Error, ev.Attempt)
		}
		if ev := evs[9]; ev.Reason != "handler returned" || ev.Attempt != 3 {
			t.Errorf("stopped event: %+v", ev)
		}
	})

	t.Run("CreationAloneAndMissing", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1, Pending: true})[0]
		evs := checkTrail(b, created.ID)
		if len(evs) != 1 || evs[0].To != task.Pending {
			t.Errorf("trail of a new pending task: %+v", evs)
		}
		if _, err := b.s.TaskEvents(b.ctx, created.ID+1000); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("events of a missing task: %v, want store.ErrNotFound", err)
		}
	})

	t.Run("RefusedWritesLeaveNoEvent", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		stale := running.Ref()
		stale.ClaimSeq--
		b.advance("a", store.ActiveTransition{Ref: stale, To: task.Succeeded})
		b.advance("b", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded})
		_, _ = b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: 1, To: task.Cancelled})
		if evs := checkTrail(b, running.ID); len(evs) != 2 {
			t.Errorf("refused writes left events: %+v", evs)
		}
	})
}
