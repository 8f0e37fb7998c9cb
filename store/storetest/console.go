package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testConsole holds what the operator's console does beyond the rest of the
// contract: a task run again as a new task, linked both ways; pipelines
// listed; the unfinished tasks counted by kind; per-minute counts.
func testConsole(t *testing.T, h Harness) {
	t.Run("RetryRunsAFailedTaskAgainAsANewTask", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Kind: "report", Key: "k", Bucket: 3, Priority: 4, MaxAttempts: 2,
			Timeout: time.Minute, Payload: []byte(`{"customer": 7}`), LimitKey: "lk", UniqueKey: "u-1"})[0]
		held := b.hold("a", created.Bucket)
		claimed := b.claim("a", held, 1, "report")
		if out := b.advance("a", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Failed, Error: "boom"}); out.Err != nil {
			t.Fatal(out.Err)
		}
		failed := b.get(created.ID)

		fresh, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: created.ID, By: "ui:alice", Reason: "fixed the report"})
		if err != nil {
			t.Fatalf("RetryTask: %v", err)
		}
		switch {
		case fresh.ID == created.ID:
			t.Fatalf("the retry is task %d itself: final states stay final, a retry is a new task", fresh.ID)
		case fresh.Status != task.Queued || fresh.Attempt != 0 || fresh.MaxAttempts != 2:
			t.Errorf("the new task is %s, attempt %d of %d; want queued, attempt 0 of a fresh 2", fresh.Status, fresh.Attempt, fresh.MaxAttempts)
		case fresh.Kind != "report" || fresh.Key != "k" || fresh.Bucket != 3 || fresh.Priority != 4 ||
			fresh.Timeout != time.Minute || !sameJSON(fresh.Payload, `{"customer": 7}`) || fresh.LimitKey != "lk" ||
			fresh.UniqueKey != "u-1":
			t.Errorf("the new task %+v does not copy the old one's kind, key, bucket, priority, timeout, payload, limit and unique keys", fresh)
		case fresh.Error != "" || fresh.Result != nil && string(fresh.Result) != "null":
			t.Errorf("the new task carries the old one's end: error %q, result %s", fresh.Error, fresh.Result)
		}
		if again := b.get(created.ID); again.Status != task.Failed || again.StatusVersion != failed.StatusVersion {
			t.Errorf("the old task is %s at version %d after the retry, want failed at %d, untouched",
				again.Status, again.StatusVersion, failed.StatusVersion)
		}
		events, err := b.s.TaskEvents(b.ctx, fresh.ID)
		if err != nil || len(events) != 1 {
			t.Fatalf("the new task's trail: %v %v", events, err)
		}
		if want := "retry of task " + itoa(created.ID) + " by ui:alice: fixed the report"; events[0].Reason != want {
			t.Errorf("the new task's creation reason is %q, want %q", events[0].Reason, want)
		}
		old, err := b.s.TaskRetries(b.ctx, created.ID)
		if err != nil || old.As == nil || old.As.RetryID != fresh.ID || old.As.By != "ui:alice" || old.As.At.IsZero() || old.Of != nil {
			t.Errorf("the old task's links: %+v %v, want run again as %d by ui:alice", old, err, fresh.ID)
		}
		linked, err := b.s.TaskRetries(b.ctx, fresh.ID)
		if err != nil || linked.Of == nil || linked.Of.TaskID != created.ID || linked.As != nil {
			t.Errorf("the new task's links: %+v %v, want a retry of %d", linked, err, created.ID)
		}
		// It runs as any task: claimed, attempt 1.
		if got := b.claim("a", held, 1, "report"); len(got) != 1 || got[0].ID != fresh.ID || got[0].Attempt != 1 {
			t.Errorf("claimed %v, want the new task at attempt 1", ids(got))
		}
	})

	t.Run("RetryRefusesWhatDidNotEndWithoutSuccess", func(t *testing.T) {
		b := setup(t, h)
		queued := b.create(store.NewTask{Key: "q", Bucket: 1})[0]
		ok := b.finished(2, "noop", task.Succeeded)
		lost := b.finished(2, "noop", task.Lost)
		for _, c := range []struct {
			id   int64
			want error
			says string
		}{
			{queued.ID, store.ErrConflict, "is queued"},
			{ok.ID, store.ErrConflict, "is succeeded"},
			{99999, store.ErrNotFound, "99999"},
		} {
			if _, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: c.id, By: "ui:x"}); !errors.Is(err, c.want) ||
				!strings.Contains(err.Error(), c.says) {
				t.Errorf("retry of task %d: %v, want %v saying %q", c.id, err, c.want, c.says)
			}
		}
		first, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: lost.ID, By: "ui:x"})
		if err != nil {
			t.Fatalf("retry of a lost task: %v", err)
		}
		if _, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: lost.ID, By: "ui:y"}); !errors.Is(err, store.ErrConflict) ||
			!strings.Contains(err.Error(), "as task "+itoa(first.ID)) {
			t.Errorf("a second retry of task %d: %v, want ErrConflict naming task %d", lost.ID, err, first.ID)
		}
		if got := b.get(queued.ID); got.Status != task.Queued || got.StatusVersion != queued.StatusVersion {
			t.Errorf("a refused retry changed task %d: %s", queued.ID, got.Status)
		}
	})

	t.Run("RetryKeepsTheUniqueKeyFree", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "once", MaxAttempts: 1})[0]
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: created.StatusVersion, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}
		holder := b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "once"})[0]
		if _, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: created.ID, By: "ui:x"}); !errors.Is(err, store.ErrDuplicate) {
			t.Errorf("retry while task %d holds the unique key: %v, want ErrDuplicate", holder.ID, err)
		}
		if r, err := b.s.TaskRetries(b.ctx, created.ID); err != nil || r.As != nil {
			t.Errorf("a refused retry left a link: %+v %v", r, err)
		}
	})

	t.Run("RetryOfAStepRunsItAgainWithItsDescendants", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("etl", step("extract"), step("load", "extract"), step("audit"))
		b.drive(p, map[string]task.Status{"extract": task.Failed})
		if got := b.statuses(p); got != "extract=failed load=skipped audit=succeeded" {
			t.Fatalf("before the retry: %s", got)
		}
		oldExtract, oldLoad := stepTask(t, b.getPipeline(p.ID), "extract"), stepTask(t, b.getPipeline(p.ID), "load")
		fresh, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: oldExtract.ID, By: "ui:alice"})
		if err != nil {
			t.Fatalf("RetryTask of step extract: %v", err)
		}
		p = b.getPipeline(p.ID)
		if got := b.statuses(p); got != "extract=queued load=pending audit=succeeded" {
			t.Errorf("after the retry: %s, want extract run again, load waiting for it, audit left", got)
		}
		if s, _ := p.Step("extract"); s.Task.ID != fresh.ID || fresh.Step != "extract" || fresh.Pipeline != p.ID || s.Tries != 2 {
			t.Errorf("the answer is task %d (step %q of %d); the step's current task is %d after %d tries",
				fresh.ID, fresh.Step, fresh.Pipeline, s.Task.ID, s.Tries)
		}
		newLoad := stepTask(t, p, "load")
		for _, c := range []struct {
			old, fresh int64
			step       string
		}{{oldExtract.ID, fresh.ID, "extract"}, {oldLoad.ID, newLoad.ID, "load"}} {
			r, err := b.s.TaskRetries(b.ctx, c.old)
			if err != nil || r.As == nil || r.As.RetryID != c.fresh {
				t.Errorf("step %s: the old task %d's links %+v %v, want run again as %d", c.step, c.old, r, err, c.fresh)
			}
			events, err := b.s.TaskEvents(b.ctx, c.fresh)
			if err != nil || !strings.Contains(events[0].Reason, "(step "+c.step+") by ui:alice") {
				t.Errorf("step %s: the new task's creation event %+v %v does not say whose retry it is", c.step, events, err)
			}
		}
		// The old task of a step is no longer its current one.
		if _, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: oldExtract.ID, By: "ui:y"}); !errors.Is(err, store.ErrConflict) {
			t.Errorf("a second retry of the old extract: %v, want ErrConflict", err)
		}
		b.drive(p, nil)
		if got := b.statuses(p); got != "extract=succeeded load=succeeded audit=succeeded" {
			t.Errorf("after the retried steps ran: %s", got)
		}
	})

	t.Run("PruningATaskRemovesItsRetryLinks", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 1)
		failed := b.finished(1, "noop", task.Failed)
		fresh, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: failed.ID, By: "ui:x"})
		if err != nil {
			t.Fatal(err)
		}
		b.h.AgeFinished(t, b.s, failed.ID, 8*24*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 1 {
			t.Fatalf("pruned %+v, want the old failed task", res)
		}
		if r, err := b.s.TaskRetries(b.ctx, fresh.ID); err != nil || r.Of != nil {
			t.Errorf("the retry's links after its original was pruned: %+v %v, want none", r, err)
		}
		if _, err := b.s.TaskRetries(b.ctx, failed.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("links of a pruned task: %v, want ErrNotFound", err)
		}
	})

	t.Run("ListPipelinesNewestFirstWithTheirStepsCounted", func(t *testing.T) {
		b := setup(t, h)
		p1 := b.pipeline("one", step("a"))
		p2 := b.pipeline("two", step("a"), step("b", "a"))
		p3 := b.pipeline("three", step("a"))
		b.drive(p2, map[string]task.Status{"a": task.Failed})
		got, err := b.s.ListPipelines(b.ctx, store.PipelineFilter{Limit: 2})
		if err != nil || len(got) != 2 || got[0].ID != p3.ID || got[1].ID != p2.ID {
			t.Fatalf("ListPipelines(limit 2): %+v %v, want %d then %d", got, err, p3.ID, p2.ID)
		}
		two := got[1]
		if two.Name != "two" || two.Key != p2.Key || two.Bucket != p2.Bucket || two.CreatedAt.IsZero() ||
			two.Total() != 2 || two.Steps[task.Failed] != 1 || two.Steps[task.Skipped] != 1 || two.Status() != store.PipelineFailed {
			t.Errorf("pipeline two: %+v (%s), want 2 steps, one failed, one skipped", two, two.Status())
		}
		if got[0].Steps[task.Queued] != 1 || got[0].Status() != store.PipelineRunning {
			t.Errorf("pipeline three: %+v, want its one step queued, running", got[0])
		}
		rest, err := b.s.ListPipelines(b.ctx, store.PipelineFilter{BeforeID: p2.ID})
		if err != nil || len(rest) != 1 || rest[0].ID != p1.ID {
			t.Errorf("ListPipelines(before %d): %+v %v, want only %d", p2.ID, rest, err, p1.ID)
		}
		// After a retry a step is counted once, by its current task.
		if _, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: stepTask(t, p2, "a").ID, By: "ui:x"}); err != nil {
			t.Fatal(err)
		}
		got, _ = b.s.ListPipelines(b.ctx, store.PipelineFilter{BeforeID: p3.ID, Limit: 1})
		if len(got) != 1 || got[0].Total() != 2 || got[0].Steps[task.Queued] != 1 || got[0].Steps[task.Pending] != 1 {
			t.Errorf("pipeline two after a retry: %+v, want one step queued, one pending", got)
		}
	})

	t.Run("UnfinishedByKindCountsTheIndexedStates", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Kind: "email", Key: "a", Bucket: 1}, store.NewTask{Kind: "email", Key: "b", Bucket: 2},
			store.NewTask{Kind: "email", Key: "c", Bucket: 1, Delay: time.Hour},
			store.NewTask{Kind: "report", Key: "d", Bucket: 1})
		b.finished(4, "email", task.Failed)
		paused := b.create(store.NewTask{Kind: "email", Key: "e", Bucket: 3})[0]
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: paused.ID, Version: paused.StatusVersion, To: task.Paused}); err != nil {
			t.Fatal(err)
		}
		held := b.hold("a", 1)
		if got := b.claim("a", held, 1, "report"); len(got) != 1 {
			t.Fatalf("claimed %v", ids(got))
		}
		got, err := b.s.UnfinishedByKind(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []store.KindCount{{Kind: "email", Status: task.Scheduled, Count: 1}, {Kind: "email", Status: task.Queued, Count: 2},
			{Kind: "report", Status: task.Running, Count: 1}}
		if len(got) != len(want) {
			t.Fatalf("UnfinishedByKind: %+v, want %+v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("UnfinishedByKind[%d] = %+v, want %+v", i, got[i], want[i])
			}
		}
	})

	t.Run("MinuteCountsAddUpAcrossNodesAndAge", func(t *testing.T) {
		b := setup(t, h)
		now, err := b.s.Now(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := now.Truncate(time.Minute).UTC()
		add := func(node string, counts ...store.MinuteCount) {
			t.Helper()
			if err := b.s.AddMinuteCounts(b.ctx, node, counts); err != nil {
				t.Fatalf("AddMinuteCounts(%s): %v", node, err)
			}
		}
		add("n1", store.MinuteCount{Minute: m.Add(-49 * time.Hour), Kind: "email", Status: task.Succeeded, Count: 9})
		add("n1", store.MinuteCount{Minute: m, Kind: "email", Status: task.Succeeded, Count: 3},
			store.MinuteCount{Minute: m, Kind: "email", Status: task.Failed, Count: 1},
			store.MinuteCount{Minute: m.Add(-2 * time.Hour), Kind: "email", Status: task.Succeeded, Count: 5})
		add("n2", store.MinuteCount{Minute: m, Kind: "email", Status: task.Succeeded, Count: 4})
		add("n1", store.MinuteCount{Minute: m, Kind: "email", Status: task.Succeeded, Count: 2})
		got, err := b.s.MinuteCounts(b.ctx, m.Add(-72*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		want := []store.MinuteCount{
			{Minute: m.Add(-2 * time.Hour), Kind: "email", Status: task.Succeeded, Count: 5},
			{Minute: m, Kind: "email", Status: task.Failed, Count: 1},
			{Minute: m, Kind: "email", Status: task.Succeeded, Count: 9},
		}
		if len(got) != len(want) {
			t.Fatalf("MinuteCounts: %+v, want %+v (the count of 49 hours ago removed)", got, want)
		}
		for i := range want {
			if !got[i].Minute.Equal(want[i].Minute) || got[i].Kind != want[i].Kind || got[i].Status != want[i].Status ||
				got[i].Count != want[i].Count {
				t.Errorf("MinuteCounts[%d] = %+v, want %+v", i, got[i], want[i])
			}
		}
		if recent, _ := b.s.MinuteCounts(b.ctx, m.Add(-time.Hour)); len(recent) != 2 {
			t.Errorf("MinuteCounts of the last hour: %+v, want this minute's two", recent)
		}
		for _, bad := range []store.MinuteCount{
			{Minute: m.Add(time.Second), Kind: "email", Status: task.Succeeded, Count: 1},
			{Minute: m, Kind: "", Status: task.Succeeded, Count: 1},
			{Minute: m, Kind: "email", Status: "done", Count: 1},
			{Minute: m, Kind: "email", Status: task.Succeeded, Count: 0},
		} {
			if err := b.s.AddMinuteCounts(b.ctx, "n1", []store.MinuteCount{bad}); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("AddMinuteCounts(%+v): %v, want ErrInvalid", bad, err)
			}
		}
	})
}
