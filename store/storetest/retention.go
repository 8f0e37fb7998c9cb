package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// pruner is the owner that holds the buckets in the retention cases.
const pruner = "pruner"

func testRetention(t *testing.T, h Harness) {
	t.Run("AgesPerState", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 1)
		ok := b.finished(1, "noop", task.Succeeded)
		bad := b.finished(1, "noop", task.Failed)
		gone := b.finished(1, "noop", task.Cancelled)
		fresh := b.finished(1, "noop", task.Succeeded)
		for _, id := range []int64{ok.ID, bad.ID, gone.ID} {
			b.h.AgeFinished(t, b.s, id, 25*time.Hour)
		}
		res := b.prune(held[0], store.DefaultRetention(), 0)
		if res.Tasks != 2 || res.ByStatus[task.Succeeded].Tasks != 1 || res.ByStatus[task.Cancelled].Tasks != 1 {
			t.Fatalf("pruned %+v, want the day-old succeeded and cancelled tasks", res)
		}
		b.mustBeGone(ok.ID, gone.ID)
		b.mustRemain(bad.ID, fresh.ID)

		b.h.AgeFinished(t, b.s, bad.ID, 7*24*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 1 || res.ByStatus[task.Failed].Tasks != 1 {
			t.Fatalf("pruned %+v, want the week-old failed task", res)
		}
		b.mustBeGone(bad.ID)
		b.mustRemain(fresh.ID)
	})

	t.Run("PerKindOverride", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 2)
		short := b.finished(2, "email", task.Succeeded)
		long := b.finished(2, "report", task.Succeeded)
		kept := b.finished(2, "noop", task.Succeeded)
		for _, id := range []int64{short.ID, long.ID, kept.ID} {
			b.h.AgeFinished(t, b.s, id, 2*time.Hour)
		}
		r := store.DefaultRetention()
		r.Kinds = map[string]store.Ages{"email": {task.Succeeded: time.Hour}, "report": {task.Failed: time.Minute}}
		if res := b.prune(held[0], r, 0); res.Tasks != 1 {
			t.Fatalf("pruned %d tasks, want only the email task past its hour", res.Tasks)
		}
		b.mustBeGone(short.ID)
		b.mustRemain(long.ID, kept.ID)
	})

	t.Run("ZeroKeepsForever", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 3)
		old := b.finished(3, "noop", task.Succeeded)
		email := b.finished(3, "email", task.Failed)
		b.h.AgeFinished(t, b.s, old.ID, 1000*24*time.Hour)
		b.h.AgeFinished(t, b.s, email.ID, 1000*24*time.Hour)
		r := store.Retention{Ages: store.DefaultAges(), Kinds: map[string]store.Ages{"email": {task.Failed: 0}}}
		r.Ages[task.Succeeded] = 0
		if res := b.prune(held[0], r, 0); res.Tasks != 0 {
			t.Fatalf("pruned %d tasks whose age is 0", res.Tasks)
		}
		b.mustRemain(old.ID, email.ID)
	})

	t.Run("AnIDIsNeverHandedOutTwice", func(t *testing.T) {
		// Once retention has removed the newest tasks, and then every
		// task, a new task still gets an id no task ever had: a user or
		// an application that kept an id (worker stop ID, get ID) must
		// never reach another task through it.
		b := setup(t, h)
		older := b.finished(5, "noop", task.Succeeded)
		queued := b.create(store.NewTask{Key: "k", Bucket: 6})[0]
		newest := b.finished(5, "noop", task.Succeeded)
		held := append(b.hold(pruner, 5), b.hold(pruner, 6)...)
		b.h.AgeFinished(t, b.s, newest.ID, 48*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 1 {
			t.Fatalf("pruned %d tasks, want the newest", res.Tasks)
		}
		b.mustBeGone(newest.ID)
		next := b.create(store.NewTask{Key: "k", Bucket: 6})[0]
		if next.ID <= newest.ID {
			t.Fatalf("the task created after task %d was pruned got id %d: an id handed out again", newest.ID, next.ID)
		}

		// An idle fleet: every task removed.
		for _, q := range []*task.Task{queued, next} {
			if _, err := b.s.Transition(b.ctx, store.Transition{ID: q.ID, Version: q.StatusVersion, To: task.Cancelled}); err != nil {
				t.Fatalf("cancel task %d: %v", q.ID, err)
			}
		}
		for _, id := range []int64{older.ID, queued.ID, next.ID} {
			b.h.AgeFinished(t, b.s, id, 48*time.Hour)
		}
		pruned := b.prune(held[0], store.DefaultRetention(), 0).Tasks + b.prune(held[1], store.DefaultRetention(), 0).Tasks
		if pruned != 3 {
			t.Fatalf("pruned %d tasks, want the 3 left", pruned)
		}
		again := b.create(store.NewTask{Key: "k", Bucket: 5}, store.NewTask{Key: "k", Bucket: 6})
		for _, tk := range again {
			if tk.ID <= next.ID {
				t.Errorf("a task created once every task was pruned got id %d, not above %d", tk.ID, next.ID)
			}
		}
	})

	t.Run("StaleHolderPrunesNothing", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 4)
		old := b.finished(4, "noop", task.Succeeded)
		b.h.AgeFinished(t, b.s, old.ID, 48*time.Hour)
		stale := held[0]
		stale.Epoch--
		req := store.PruneRequest{Owner: pruner, Bucket: 4, Epoch: stale.Epoch, Retention: store.DefaultRetention()}
		if res, err := b.s.PruneFinished(b.ctx, req); !errors.Is(err, store.ErrFenced) || res.Tasks != 0 {
			t.Fatalf("prune under an old epoch: %+v, %v; want ErrFenced and nothing", res, err)
		}
		req.Owner, req.Epoch = "someone-else", held[0].Epoch
		if _, err := b.s.PruneFinished(b.ctx, req); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("prune by a non-holder: %v, want ErrFenced", err)
		}
		b.h.ExpireBucketLease(t, b.s, 4)
		req.Owner = pruner
		if _, err := b.s.PruneFinished(b.ctx, req); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("prune under an expired lease: %v, want ErrFenced", err)
		}
		b.mustRemain(old.ID)
		held = b.hold("next-holder", 4)
		if held[0].Epoch <= stale.Epoch+1 {
			t.Fatalf("the next holder has epoch %d, want above %d", held[0].Epoch, stale.Epoch+1)
		}
		req.Owner, req.Epoch = "next-holder", held[0].Epoch
		if res, err := b.s.PruneFinished(b.ctx, req); err != nil || res.Tasks != 1 {
			t.Fatalf("prune by the current holder: %+v, %v; want the old task", res, err)
		}
	})

	t.Run("UnfinishedPipelineKept", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("etl", step("extract"), step("load", "extract"))
		held := b.hold(pruner, p.Bucket)
		claimed := b.claim(pruner, held, 10)
		if len(claimed) != 1 {
			t.Fatalf("claimed %d steps, want extract alone", len(claimed))
		}
		if out := b.advance(pruner, store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Succeeded}); out.Err != nil {
			t.Fatal(out.Err)
		}
		extract := claimed[0].ID
		b.h.AgeFinished(t, b.s, extract, 48*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 0 {
			t.Fatalf("pruned %d tasks of a pipeline whose load step is queued", res.Tasks)
		}
		load := b.claim(pruner, held, 10)
		if len(load) != 1 {
			t.Fatalf("claimed %d steps, want load", len(load))
		}
		if out := b.advance(pruner, store.ActiveTransition{Ref: load[0].Ref(), To: task.Succeeded}); out.Err != nil {
			t.Fatal(out.Err)
		}
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 0 {
			t.Fatalf("pruned %d tasks of a pipeline whose load step finished just now", res.Tasks)
		}
		b.h.AgeFinished(t, b.s, load[0].ID, 48*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 2 {
			t.Fatalf("pruned %d tasks, want the whole finished pipeline", res.Tasks)
		}
		b.mustBeGone(extract, load[0].ID)
		if _, err := b.s.GetPipeline(b.ctx, p.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetPipeline of a pruned pipeline: %v, want ErrNotFound", err)
		}
	})

	t.Run("APipelinePrunedOverSeveralBatchesIsGoneFromTheFirst", func(t *testing.T) {
		// A finished pipeline larger than a batch goes a batch at a time,
		// but is never seen partial: from the first batch that removes a
		// task of it, it is gone to GetPipeline, the list and a retry (a
		// retry of transform, planned against an extract with no task,
		// would wait for it forever); the next batches take the rest.
		b := setup(t, h)
		p := b.pipeline("etl", step("extract"), step("transform", "extract"), step("load", "transform"))
		held := b.hold(pruner, p.Bucket)
		for _, end := range []task.Status{task.Succeeded, task.Failed} {
			claimed := b.claim(pruner, held, 10)
			if len(claimed) != 1 {
				t.Fatalf("claimed %d steps, want the next one of the chain", len(claimed))
			}
			if out := b.advance(pruner, store.ActiveTransition{Ref: claimed[0].Ref(), To: end}); out.Err != nil {
				t.Fatal(out.Err)
			}
		}
		whole := b.getPipeline(p.ID)
		if got := b.statuses(whole); got != "extract=succeeded transform=failed load=skipped" {
			t.Fatalf("before retention: %s", got)
		}
		var ids []int64
		for _, s := range whole.Steps {
			ids = append(ids, s.Task.ID)
			b.h.AgeFinished(t, b.s, s.Task.ID, 30*24*time.Hour) // past the failed tasks' age too
		}
		for batch := 1; batch <= len(ids); batch++ {
			if res := b.prune(held[0], store.DefaultRetention(), 1); res.Tasks != 1 {
				t.Fatalf("batch %d of 1 pruned %d tasks", batch, res.Tasks)
			}
			if got, err := b.s.RetryPipeline(b.ctx, p.ID, "transform"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("RetryPipeline after batch %d: %v (%d steps), want ErrNotFound", batch, err, len(got.Steps))
			}
			if got, err := b.s.GetPipeline(b.ctx, p.ID); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("GetPipeline after batch %d: %v (%d steps), want ErrNotFound", batch, err, len(got.Steps))
			}
			if batch == 1 { // transform is left: running it again is a retry of the pipeline too
				if got, err := b.s.RetryTask(b.ctx, store.RetryRequest{ID: ids[1], By: "op"}); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("RetryTask of transform after batch 1: %v, %v; want ErrNotFound", got, err)
				}
			}
			if list, err := b.s.ListPipelines(b.ctx, store.PipelineFilter{}); err != nil || len(list) != 0 {
				t.Fatalf("ListPipelines after batch %d: %+v, %v; want none", batch, list, err)
			}
		}
		b.mustBeGone(ids...)
		if left, err := b.s.ListTasks(b.ctx, store.TaskFilter{}); err != nil || len(left) != 0 {
			t.Fatalf("after the last batch %d tasks are left (%v), want none", len(left), err)
		}
	})

	t.Run("UnacknowledgedCommandKept", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 5)
		done := b.finished(5, "noop", task.Succeeded)
		b.h.AgeFinished(t, b.s, done.ID, 48*time.Hour)
		cmd, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: done.ID, Kind: store.CommandResume, IssuedBy: "ops"})
		if err != nil {
			t.Fatalf("IssueCommand: %v", err)
		}
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 0 {
			t.Fatalf("pruned %d tasks, one named by an unacknowledged command", res.Tasks)
		}
		if _, err := b.s.AckCommand(b.ctx, cmd.ID, "ops", "not applied"); err != nil {
			t.Fatalf("AckCommand: %v", err)
		}
		res := b.prune(held[0], store.DefaultRetention(), 0)
		if res.Tasks != 1 || res.Commands != 1 {
			t.Fatalf("pruned %+v, want the task and its acknowledged command", res)
		}
		if _, err := b.s.GetCommand(b.ctx, cmd.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetCommand of a pruned task's command: %v, want ErrNotFound", err)
		}
	})

	t.Run("BatchesBoundedOldestFirst", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 6)
		var all []int64
		for i := range 5 {
			tk := b.finished(6, "noop", task.Succeeded)
			b.h.AgeFinished(t, b.s, tk.ID, time.Duration(100-i)*time.Hour) // the first is the oldest
			all = append(all, tk.ID)
		}
		dry, err := b.s.PruneFinished(b.ctx, store.PruneRequest{Bucket: 6, Retention: store.DefaultRetention(), DryRun: true})
		if err != nil || dry.Tasks != 5 || dry.ByStatus[task.Succeeded].Tasks != 5 {
			t.Fatalf("dry run: %+v, %v; want 5 succeeded", dry, err)
		}
		b.mustRemain(all...)
		for i, want := range []int{2, 2, 1, 0} {
			if res := b.prune(held[0], store.DefaultRetention(), 2); res.Tasks != want {
				t.Fatalf("batch %d pruned %d, want %d", i, res.Tasks, want)
			}
			if i == 0 {
				b.mustBeGone(all[0], all[1])
				b.mustRemain(all[2:]...)
			}
		}
		if _, err := b.s.PruneFinished(b.ctx, store.PruneRequest{Owner: pruner, Bucket: 6, Epoch: held[0].Epoch,
			Limit: store.MaxPruneBatch + 1}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("a batch above MaxPruneBatch: %v, want ErrInvalid", err)
		}
	})

	t.Run("EventsGoWithTheTask", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 7)
		done := b.finished(7, "noop", task.Succeeded)
		other := b.finished(7, "noop", task.Succeeded)
		evs, err := b.s.TaskEvents(b.ctx, done.ID)
		if err != nil || len(evs) < 3 {
			t.Fatalf("TaskEvents before: %d events, %v", len(evs), err)
		}
		b.h.AgeFinished(t, b.s, done.ID, 48*time.Hour)
		res := b.prune(held[0], store.DefaultRetention(), 0)
		if res.Tasks != 1 || res.Events != len(evs)-1 {
			t.Fatalf("pruned %+v, want 1 task and its %d stored events (the creation event is the row)", res, len(evs)-1)
		}
		if _, err := b.s.TaskEvents(b.ctx, done.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("TaskEvents of a pruned task: %v, want ErrNotFound", err)
		}
		if got, err := b.s.TaskEvents(b.ctx, other.ID); err != nil || len(got) != len(evs) {
			t.Fatalf("the other task's trail: %d events, %v; want %d", len(got), err, len(evs))
		}
	})

	t.Run("OnlyItsBucket", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold(pruner, 0)
		mine := b.finished(0, "noop", task.Succeeded)
		b.hold("other", 1)
		theirs := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: theirs.ID, Version: theirs.StatusVersion, To: task.Cancelled}); err != nil {
			t.Fatalf("cancel: %v", err)
		}
		b.h.AgeFinished(t, b.s, mine.ID, 48*time.Hour)
		b.h.AgeFinished(t, b.s, theirs.ID, 48*time.Hour)
		if res := b.prune(held[0], store.DefaultRetention(), 0); res.Tasks != 1 {
			t.Fatalf("pruned %d, want the task of bucket 0 alone", res.Tasks)
		}
		b.mustBeGone(mine.ID)
		b.mustRemain(theirs.ID)
	})
}

// finished creates a task of kind in bucketNo and ends it in state to: a
// cancellation from queued, or a claim by pruner ended as to.
func (b *testBundle) finished(bucketNo int, kind string, to task.Status) *task.Task {
	b.t.Helper()
	created := b.create(store.NewTask{Kind: kind, Key: "k", Bucket: bucketNo, MaxAttempts: 1})[0]
	if to == task.Cancelled {
		done, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: created.StatusVersion, To: to})
		if err != nil {
			b.t.Fatalf("cancel task %d: %v", created.ID, err)
		}
		return done
	}
	held := b.hold(pruner, bucketNo)
	claimed := b.claim(pruner, held, 10, kind)
	if len(claimed) != 1 || claimed[0].ID != created.ID {
		b.t.Fatalf("claimed %v, want task %d", ids(claimed), created.ID)
	}
	if out := b.advance(pruner, store.ActiveTransition{Ref: claimed[0].Ref(), To: to}); out.Err != nil || out.Status != to {
		b.t.Fatalf("ending task %d as %s: %s, %v", created.ID, to, out.Status, out.Err)
	}
	return b.get(created.ID)
}

func (b *testBundle) prune(h store.HeldBucket, r store.Retention, limit int) store.PruneResult {
	b.t.Helper()
	res, err := b.s.PruneFinished(b.ctx, store.PruneRequest{Owner: pruner, Bucket: h.Bucket, Epoch: h.Epoch,
		Retention: r, Limit: limit})
	if err != nil {
		b.t.Fatalf("PruneFinished(bucket %d): %v", h.Bucket, err)
	}
	return res
}

func (b *testBundle) mustBeGone(ids ...int64) {
	b.t.Helper()
	for _, id := range ids {
		if _, err := b.s.GetTask(b.ctx, id); !errors.Is(err, store.ErrNotFound) {
			b.t.Errorf("task %d: %v, want it pruned (ErrNotFound)", id, err)
		}
		if _, err := b.s.TaskEvents(b.ctx, id); !errors.Is(err, store.ErrNotFound) {
			b.t.Errorf("events of task %d: %v, want them pruned (ErrNotFound)", id, err)
		}
	}
}

func (b *testBundle) mustRemain(ids ...int64) {
	b.t.Helper()
	for _, id := range ids {
		if _, err := b.s.GetTask(b.ctx, id); err != nil {
			b.t.Errorf("task %d: %v, want it kept", id, err)
		}
	}
}
