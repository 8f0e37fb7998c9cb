package storetest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testPipelines holds the pipeline contract: a step waits in pending until
// its dependencies end, is released or skipped in the same write that ends
// its last (or first refused) dependency, reads its dependencies' results,
// may have steps appended with its outcome, fenced like it, and a retry runs
// a step and its unsucceeded descendants again and nothing else.
func testPipelines(t *testing.T, h Harness) {
	t.Run("ReleasedOnSuccessInTheCompletingWrite", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("release", step("a"), step("b"), step("c", "a", "b"))
		c := stepTask(t, p, "c")
		if c.Status != task.Pending {
			t.Fatalf("c starts %s, want pending", c.Status)
		}
		held := b.hold("x", p.Bucket)
		claimed := b.claim("x", held, 10)
		if got := names(claimed); got != "a b" {
			t.Fatalf("claimed %q, want a and b only: c waits for them", got)
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Succeeded})
		if got := b.get(c.ID); got.Status != task.Pending {
			t.Fatalf("c is %s after one of its two dependencies, want pending", got.Status)
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[1].Ref(), To: task.Succeeded})
		if got := b.get(c.ID); got.Status != task.Queued {
			t.Fatalf("c is %s after its last dependency succeeded, want queued", got.Status)
		}
		evs := checkTrail(b, c.ID)
		last := evs[len(evs)-1]
		if last.From != task.Pending || last.To != task.Queued || last.Reason != store.ReasonDependenciesMet || last.Node != nodeOf("x") {
			t.Errorf("c's release is audited as %+v, want pending -> queued (%s) by %s", last, store.ReasonDependenciesMet, nodeOf("x"))
		}
		if got := names(b.claim("x", held, 10)); got != "c" {
			t.Errorf("then claimed %q, want c", got)
		}
	})

	t.Run("AFanInCountsEveryDependencyEndedInOneWrite", func(t *testing.T) {
		// Two of a fan-in's three dependencies end in one write, the
		// third in the next: each is counted once, and the fan-in is
		// released by the write that ends the last, not before.
		b := setup(t, h)
		p := b.pipeline("fan-in", step("a"), step("b"), step("c"), step("in", "a", "b", "c"))
		in := stepTask(t, p, "in")
		held := b.hold("x", p.Bucket)
		claimed := b.claim("x", held, 10)
		if got := names(claimed); got != "a b c" {
			t.Fatalf("claimed %q, want a, b and c", got)
		}
		out, err := b.s.AdvanceActive(b.ctx, "x", []store.ActiveTransition{
			{Ref: claimed[0].Ref(), To: task.Succeeded, Node: nodeOf("x")},
			{Ref: claimed[1].Ref(), To: task.Succeeded, Node: nodeOf("x")}})
		if err != nil || len(out) != 2 || out[0].Err != nil || out[1].Err != nil {
			t.Fatalf("ending a and b in one write: %+v, %v", out, err)
		}
		if got := b.get(in.ID); got.Status != task.Pending {
			t.Fatalf("in is %s after two of its three dependencies, want pending", got.Status)
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[2].Ref(), To: task.Succeeded})
		if got := b.get(in.ID); got.Status != task.Queued {
			t.Fatalf("in is %s after its last dependency succeeded, want queued", got.Status)
		}
		checkTrail(b, in.ID)
	})

	t.Run("EveryStepInThePipelineKeysBucket", func(t *testing.T) {
		b := setup(t, h)
		policy, _ := bucket.NewPolicy(numBuckets)
		keyed := b.pipelineKey("keyed", "tenant-7", step("a"), step("b", "a"), step("c", "a"))
		unkeyed := b.pipeline("nightly", step("a"), step("b", "a"))
		for _, p := range []store.Pipeline{keyed, unkeyed} {
			wantKey := p.Key
			if p.Name == "nightly" {
				wantKey = "nightly-" + itoa(p.ID)
			}
			if p.Key != wantKey || p.Bucket != policy.Of(wantKey) {
				t.Errorf("pipeline %s: key %q bucket %d, want %q bucket %d", p.Name, p.Key, p.Bucket, wantKey, policy.Of(wantKey))
			}
			for _, s := range p.Steps {
				if s.Task.Bucket != p.Bucket || s.Task.Key != p.Key || s.Task.Pipeline != p.ID || s.Task.Step != s.Name {
					t.Errorf("step %s: bucket %d key %q pipeline %d step %q", s.Name, s.Task.Bucket, s.Task.Key, s.Task.Pipeline, s.Task.Step)
				}
			}
		}
	})

	t.Run("ASkipRunsDownAChain", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("chain", step("a"), step("b", "a"), step("c", "b"), step("d", "c"))
		b.drive(p, map[string]task.Status{"a": task.Failed})
		got := b.statuses(p)
		if got != "a=failed b=skipped c=skipped d=skipped" {
			t.Fatalf("statuses %s", got)
		}
		wantReason := map[string]string{
			"b": "dependency a ended failed; this step runs on success",
			"c": "dependency b was skipped",
			"d": "dependency c was skipped",
		}
		for name, reason := range wantReason {
			evs := checkTrail(b, stepTask(t, p, name).ID)
			if last := evs[len(evs)-1]; last.Reason != reason || last.From != task.Pending {
				t.Errorf("%s skipped with %+v, want reason %q", name, last, reason)
			}
		}
	})

	t.Run("ASkipRunsThroughADiamond", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("diamond", step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"), step("e", "d"))
		b.drive(p, map[string]task.Status{"b": task.Failed})
		if got := b.statuses(p); got != "a=succeeded b=failed c=succeeded d=skipped e=skipped" {
			t.Fatalf("statuses %s", got)
		}
	})

	t.Run("EachPolicy", func(t *testing.T) {
		for _, tc := range []struct {
			on     string
			parent task.Status
			want   task.Status
		}{
			{"", task.Succeeded, task.Succeeded},
			{task.OnSuccess, task.Failed, task.Skipped},
			{task.OnAny, task.Succeeded, task.Succeeded},
			{task.OnAny, task.Failed, task.Succeeded},
			{task.OnFailure, task.Failed, task.Succeeded},
			{task.OnFailure, task.Succeeded, task.Skipped},
			{task.OnFailure, task.TimedOut, task.Succeeded},
		} {
			t.Run(tc.on+"/"+string(tc.parent), func(t *testing.T) {
				b := setup(t, h)
				child := step("child")
				child.DependsOn = []task.Dependency{{Step: "parent", On: tc.on}}
				p := b.pipeline("policy", step("parent"), child)
				b.drive(p, map[string]task.Status{"parent": tc.parent})
				if got := b.getPipeline(p.ID); stepTask(t, got, "child").Status != tc.want {
					t.Errorf("child is %s, want %s", stepTask(t, got, "child").Status, tc.want)
				}
			})
		}
	})

	t.Run("ATransitionEndingAStepResolvesItsDependents", func(t *testing.T) {
		// Ends made by Transition (an operator's cancel, a rescue's lost)
		// release and skip like a completion.
		b := setup(t, h)
		cleanup := step("cleanup")
		cleanup.DependsOn = []task.Dependency{{Step: "a", On: task.OnFailure}}
		p := b.pipeline("cancel", step("a"), step("b", "a"), cleanup)
		a := stepTask(t, p, "a")
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: a.ID, Version: a.StatusVersion, To: task.Cancelled, Node: "op"}); err != nil {
			t.Fatal(err)
		}
		if got := b.statuses(p); got != "a=cancelled b=skipped cleanup=queued" {
			t.Fatalf("statuses %s", got)
		}
		checkTrail(b, stepTask(t, p, "cleanup").ID)
	})

	t.Run("AStepPausedWhilePendingCountsDownButIsNotReleased", func(t *testing.T) {
		// A pipeline's pause moves its pending steps to paused. Their
		// dependencies go on ending: the count goes down and a refused end
		// still skips, but none is queued until it is resumed, and a resume
		// of one still waiting sends it back to pending.
		b := setup(t, h)
		cleanup := step("cleanup")
		cleanup.DependsOn = []task.Dependency{{Step: "a", On: task.OnFailure}}
		p := b.pipeline("paused", step("a"), step("b", "a"), step("c", "b"), cleanup)
		held := b.hold("x", p.Bucket)
		claimed := b.claim("x", held, 10)
		if got := names(claimed); got != "a" {
			t.Fatalf("claimed %q, want a", got)
		}
		for _, name := range []string{"b", "c", "cleanup"} {
			st := stepTask(t, p, name)
			if _, err := b.s.Transition(b.ctx, store.Transition{ID: st.ID, Version: st.StatusVersion, To: task.Paused, Reason: "pause requested"}); err != nil {
				t.Fatalf("pausing pending step %s: %v", name, err)
			}
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Succeeded})
		if got := b.statuses(p); got != "a=succeeded b=paused c=paused cleanup=skipped" {
			t.Fatalf("statuses %s, want b and c paused and cleanup skipped", got)
		}
		if got := b.claim("x", held, 10); len(got) != 0 {
			t.Fatalf("claimed %q while every step left is paused", names(got))
		}
		evs := checkTrail(b, stepTask(t, p, "cleanup").ID)
		if last := evs[len(evs)-1]; last.From != task.Paused || last.To != task.Skipped ||
			last.Reason != "dependency a ended succeeded; this step runs on failure" {
			t.Errorf("cleanup's skip is audited as %+v, want paused -> skipped naming a", last)
		}
		bt := b.get(stepTask(t, p, "b").ID)
		if got, err := b.s.Transition(b.ctx, store.Transition{ID: bt.ID, Version: bt.StatusVersion, To: task.Queued, Reason: "resume requested"}); err != nil || got.Status != task.Queued {
			t.Fatalf("resuming b, whose dependency ended: %v, %v; want queued", got, err)
		}
		ct := b.get(stepTask(t, p, "c").ID)
		if got, err := b.s.Transition(b.ctx, store.Transition{ID: ct.ID, Version: ct.StatusVersion, To: task.Queued, Reason: "resume requested"}); err != nil || got.Status != task.Pending {
			t.Fatalf("resuming c, whose dependency b has not ended: %v, %v; want pending", got, err)
		}
		claimed = b.claim("x", held, 10)
		if got := names(claimed); got != "b" {
			t.Fatalf("claimed %q after the resume, want b", got)
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Succeeded})
		if got := b.statuses(p); got != "a=succeeded b=succeeded c=queued cleanup=skipped" {
			t.Fatalf("statuses %s, want c released by b once resumed", got)
		}
		for _, s := range b.getPipeline(p.ID).Steps {
			checkTrail(b, s.Task.ID)
		}
	})

	t.Run("AStepPausedWhilePendingCountsDownWithoutAnEvent", func(t *testing.T) {
		// a's end releases c and counts b down, b being paused, in a
		// statement that skips nothing: b stays paused with no event of
		// its own, and c's event says it left pending.
		b := setup(t, h)
		p := b.pipeline("paused-fan-out", step("a"), step("b", "a"), step("c", "a"))
		held := b.hold("x", p.Bucket)
		claimed := b.claim("x", held, 10)
		if got := names(claimed); got != "a" {
			t.Fatalf("claimed %q, want a", got)
		}
		bt := stepTask(t, p, "b")
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: bt.ID, Version: bt.StatusVersion, To: task.Paused, Reason: "pause requested"}); err != nil {
			t.Fatalf("pausing pending step b: %v", err)
		}
		b.advance("x", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Succeeded})
		if got := b.statuses(p); got != "a=succeeded b=paused c=queued" {
			t.Fatalf("statuses %s, want b paused and c queued", got)
		}
		evs := checkTrail(b, bt.ID)
		if last := evs[len(evs)-1]; last.From != task.Pending || last.To != task.Paused || last.Reason != "pause requested" {
			t.Errorf("b's last event is %+v, want its pause: a paused step counting down is no move", last)
		}
		evs = checkTrail(b, stepTask(t, p, "c").ID)
		if last := evs[len(evs)-1]; last.From != task.Pending || last.To != task.Queued || last.Reason != store.ReasonDependenciesMet {
			t.Errorf("c's release is audited as %+v, want pending -> queued, %s", last, store.ReasonDependenciesMet)
		}
		bt = b.get(bt.ID)
		if got, err := b.s.Transition(b.ctx, store.Transition{ID: bt.ID, Version: bt.StatusVersion, To: task.Queued, Reason: "resume requested"}); err != nil || got.Status != task.Queued {
			t.Fatalf("resuming b, whose dependency ended: %v, %v; want queued", got, err)
		}
		checkTrail(b, bt.ID)
	})

	t.Run("ResultsArePassed", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("results", step("a"), step("b"), step("c"), step("fanin", "a", "b", "c"))
		held := b.hold("x", p.Bucket)
		results := map[string]string{"a": `{"rows": 1}`, "b": `[1, 2]`}
		for _, tk := range b.claim("x", held, 10) {
			at := store.ActiveTransition{Ref: tk.Ref(), To: task.Succeeded}
			if r, ok := results[tk.Step]; ok {
				at.Result = json.RawMessage(r)
			}
			b.advance("x", at)
		}
		fanin := stepTask(t, p, "fanin").ID
		got, err := b.s.DependencyResults(b.ctx, fanin, store.MaxDependencyResultsBytes)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || !sameJSON(got["a"], results["a"]) || !sameJSON(got["b"], results["b"]) || got["c"] != nil {
			t.Errorf("dependency results %v, want a, b and c (nil)", stringsOf(got))
		}
		if _, err := b.s.DependencyResults(b.ctx, 1_000_000, store.MaxDependencyResultsBytes); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("results of a missing task: %v, want store.ErrNotFound", err)
		}
		// Over the bound, refused before any is read: a and b's results
		// take about 15 bytes as JSON ({"rows":1} and [1,2], spaced or not).
		var tooLarge *store.DependencyResultsTooLargeError
		got, err = b.s.DependencyResults(b.ctx, fanin, 8)
		if !errors.As(err, &tooLarge) || !errors.Is(err, store.ErrDependencyResultsTooLarge) || got != nil {
			t.Fatalf("results over a bound of 8 bytes: %v, %v; want *store.DependencyResultsTooLargeError", stringsOf(got), err)
		}
		if tooLarge.Task != fanin || tooLarge.Max != 8 || tooLarge.Bytes < 15 || tooLarge.Bytes > 20 {
			t.Errorf("refusal %+v, want task %d, max 8 and 15 to 20 bytes", *tooLarge, fanin)
		}
		if _, err := b.s.DependencyResults(b.ctx, fanin, tooLarge.Bytes); err != nil {
			t.Errorf("results of exactly the bound: %v, want them read", err)
		}
	})

	t.Run("AppendIsWrittenWithTheOutcomeAndFenced", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("append", step("a"), step("z"))
		held := b.hold("x", p.Bucket)
		claimed := b.claim("x", held, 10)
		a := claimed[0]
		more := []task.Step{step("a1"), step("a2", "a1")}
		// A stale incarnation's append is refused with its outcome.
		if out := b.advance("x-old", store.ActiveTransition{Ref: a.Ref(), To: task.Succeeded, Append: more}); !errors.Is(out.Err, store.ErrFenced) {
			t.Fatalf("append by a stale attempt: %+v, want store.ErrFenced", out)
		}
		if got := b.getPipeline(p.ID); len(got.Steps) != 2 {
			t.Fatalf("a fenced append added steps: %s", b.statuses(got))
		}
		// A retried attempt drops what it appended.
		b.advance("x", store.ActiveTransition{Ref: a.Ref(), To: task.Retrying, Append: more})
		if got := b.getPipeline(p.ID); len(got.Steps) != 2 {
			t.Fatalf("a retried attempt's append was written: %s", b.statuses(got))
		}
		a = b.claim("x", held, 10)[0]
		if out := b.advance("x", store.ActiveTransition{Ref: a.Ref(), To: task.Succeeded, Append: more}); out.Err != nil || out.Status != task.Succeeded {
			t.Fatalf("append with success: %+v", out)
		}
		got := b.getPipeline(p.ID)
		if s := b.statuses(got); s != "a=succeeded z=running a1=queued a2=pending" {
			t.Fatalf("after the append: %s", s)
		}
		a1 := stepTask(t, got, "a1")
		if a1.Bucket != p.Bucket || a1.Pipeline != p.ID {
			t.Errorf("appended step in bucket %d pipeline %d", a1.Bucket, a1.Pipeline)
		}
		// Every appended step depends on its appender as well.
		if s, _ := got.Step("a2"); len(s.DependsOn) != 2 || s.DependsOn[0].Step != "a" || s.DependsOn[1].Step != "a1" {
			t.Errorf("a2 depends on %+v, want a and a1", s.DependsOn)
		}
		// An append that names a step the pipeline has fails its task.
		z := stepTask(t, got, "z")
		out := b.advance("x", store.ActiveTransition{Ref: z.Ref(), To: task.Succeeded, Append: []task.Step{step("a1")}})
		if out.Err != nil || out.Status != task.Failed {
			t.Fatalf("an append of a taken name: %+v, want the task failed", out)
		}
		if zt := b.get(z.ID); !strings.Contains(zt.Error, `"a1"`) {
			t.Errorf("the failed append's error %q does not name the step", zt.Error)
		}
	})

	t.Run("RetryFromAStep", func(t *testing.T) {
		b := setup(t, h)
		p := b.pipeline("retry", step("a"), step("b", "a"), step("c", "b"), step("d", "a"), step("e", "c", "d"))
		b.drive(p, map[string]task.Status{"b": task.Failed})
		before := b.getPipeline(p.ID)
		if got := b.statuses(before); got != "a=succeeded b=failed c=skipped d=succeeded e=skipped" {
			t.Fatalf("before the retry: %s", got)
		}
		if _, err := b.s.RetryPipeline(b.ctx, p.ID, "d"); !errors.Is(err, store.ErrConflict) {
			t.Errorf("retry from a succeeded step: %v, want store.ErrConflict", err)
		}
		if _, err := b.s.RetryPipeline(b.ctx, p.ID, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("retry from a missing step: %v, want store.ErrNotFound", err)
		}
		// From e, skipped because c was, which was skipped because b
		// failed: run alone it would be skipped again. Refused, naming b.
		var skipped *store.SkippedStepError
		if _, err := b.s.RetryPipeline(b.ctx, p.ID, "e"); !errors.As(err, &skipped) || skipped.Dependency != "b" ||
			skipped.Status != task.Failed {
			t.Errorf("retry from a step its failed ancestor skipped: %v, want a *store.SkippedStepError naming b", err)
		}
		if got := b.statuses(b.getPipeline(p.ID)); got != "a=succeeded b=failed c=skipped d=succeeded e=skipped" {
			t.Errorf("a refused retry changed the pipeline: %s", got)
		}
		after, err := b.s.RetryPipeline(b.ctx, p.ID, "b")
		if err != nil {
			t.Fatal(err)
		}
		if got := b.statuses(after); got != "a=succeeded b=queued c=pending d=succeeded e=pending" {
			t.Fatalf("after the retry: %s", got)
		}
		for _, name := range []string{"a", "d"} {
			if stepTask(t, after, name).ID != stepTask(t, before, name).ID {
				t.Errorf("step %s was run again", name)
			}
		}
		for _, name := range []string{"b", "c", "e"} {
			old := b.get(stepTask(t, before, name).ID)
			if old.Status != stepTask(t, before, name).Status {
				t.Errorf("the old task of %s changed: %s", name, old.Status)
			}
			if s, _ := after.Step(name); s.Tries != 2 {
				t.Errorf("step %s has %d tries, want 2", name, s.Tries)
			}
		}
		b.drive(after, nil)
		if got := b.getPipeline(p.ID); got.Status() != store.PipelineSucceeded {
			t.Errorf("after the retried steps ran: %s (%s)", got.Status(), b.statuses(got))
		}
	})

	t.Run("RetryLeavesADescendantThatSucceeded", func(t *testing.T) {
		// A clean-up step that ran on b's failure succeeded: running b
		// again does not run it again.
		b := setup(t, h)
		cleanup := step("cleanup")
		cleanup.DependsOn = []task.Dependency{{Step: "b", On: task.OnFailure}}
		p := b.pipeline("retry", step("a"), step("b", "a"), cleanup, step("c", "b"))
		b.drive(p, map[string]task.Status{"b": task.Failed})
		before := b.getPipeline(p.ID)
		if got := b.statuses(before); got != "a=succeeded b=failed cleanup=succeeded c=skipped" {
			t.Fatalf("before the retry: %s", got)
		}
		after, err := b.s.RetryPipeline(b.ctx, p.ID, "b")
		if err != nil {
			t.Fatal(err)
		}
		if got := b.statuses(after); got != "a=succeeded b=queued cleanup=succeeded c=pending" {
			t.Fatalf("after the retry: %s", got)
		}
		if s, _ := after.Step("cleanup"); s.Tries != 1 || s.Task.ID != stepTask(t, before, "cleanup").ID {
			t.Errorf("cleanup, which succeeded, was run again: %d tries, task %d", s.Tries, s.Task.ID)
		}
	})

	t.Run("ASkippedDependencyIsAcceptedByNoPolicy", func(t *testing.T) {
		// A step that never ran produced nothing: even a step that runs on
		// any end, or on failure, of it is skipped.
		b := setup(t, h)
		anyEnd, onFailure := step("any"), step("failure")
		anyEnd.DependsOn = []task.Dependency{{Step: "p", On: task.OnAny}}
		onFailure.DependsOn = []task.Dependency{{Step: "p", On: task.OnFailure}}
		p := b.pipeline("skipped", step("g"), step("p", "g"), anyEnd, onFailure)
		b.drive(p, map[string]task.Status{"g": task.Failed})
		if got := b.statuses(p); got != "g=failed p=skipped any=skipped failure=skipped" {
			t.Fatalf("statuses %s", got)
		}
		for _, name := range []string{"any", "failure"} {
			evs := checkTrail(b, stepTask(t, p, name).ID)
			if last := evs[len(evs)-1]; last.Reason != "dependency p was skipped" {
				t.Errorf("%s skipped with reason %q, want %q", name, last.Reason, "dependency p was skipped")
			}
		}
	})

	t.Run("AStepThatEndedIsNotMovedByItsDependencies", func(t *testing.T) {
		// c is skipped by the first of its two dependencies to fail, and
		// only once; d, cancelled while pending, stays cancelled when its
		// dependency ends.
		b := setup(t, h)
		p := b.pipeline("ended", step("a"), step("b"), step("c", "a", "b"), step("d", "a"))
		d := stepTask(t, p, "d")
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: d.ID, Version: d.StatusVersion, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}
		b.drive(p, map[string]task.Status{"a": task.Succeeded, "b": task.Failed})
		if got := b.statuses(p); got != "a=succeeded b=failed c=skipped d=cancelled" {
			t.Fatalf("statuses %s", got)
		}
		if evs := checkTrail(b, stepTask(t, p, "c").ID); len(evs) != 2 {
			t.Errorf("c has %d events, want its creation and one skip", len(evs))
		}
		p2 := b.pipeline("twice", step("a"), step("b"), step("c", "a", "b"))
		b.drive(p2, map[string]task.Status{"a": task.Failed, "b": task.Failed})
		if got := b.statuses(p2); got != "a=failed b=failed c=skipped" {
			t.Fatalf("statuses %s", got)
		}
		if evs := checkTrail(b, stepTask(t, p2, "c").ID); len(evs) != 2 {
			t.Errorf("c, whose two dependencies failed, has %d events, want its creation and one skip", len(evs))
		}
	})

	t.Run("ASkipStopsAtAStepThatIsNotWaiting", func(t *testing.T) {
		// c, cancelled while pending, was accepted by d (on any), which
		// then waits for b alone. a's failure would skip c, had c still
		// waited: it does not, so the skip stops there, and neither d
		// (pending on b, or queued once b succeeded) nor e behind it is
		// skipped.
		for _, bFirst := range []bool{false, true} {
			b := setup(t, h)
			anyEnd := step("d", "b")
			anyEnd.DependsOn = append(anyEnd.DependsOn, task.Dependency{Step: "c", On: task.OnAny})
			p := b.pipeline("walk", step("a"), step("b"), step("c", "a"), anyEnd, step("e", "d"))
			c := stepTask(t, p, "c")
			if _, err := b.s.Transition(b.ctx, store.Transition{ID: c.ID, Version: c.StatusVersion, To: task.Cancelled, Node: "op"}); err != nil {
				t.Fatal(err)
			}
			held := b.hold("x", p.Bucket)
			claimed := map[string]*task.Task{}
			for _, tk := range b.claim("x", held, 10) {
				claimed[tk.Step] = tk
			}
			if len(claimed) != 2 || claimed["a"] == nil || claimed["b"] == nil {
				t.Fatalf("claimed %v, want a and b", claimed)
			}
			if bFirst {
				b.advance("x", store.ActiveTransition{Ref: claimed["b"].Ref(), To: task.Succeeded})
				b.advance("x", store.ActiveTransition{Ref: claimed["a"].Ref(), To: task.Failed})
				if got := b.statuses(p); got != "a=failed b=succeeded c=cancelled d=queued e=pending" {
					t.Fatalf("after b succeeded and a failed, d queued: %s", got)
				}
			} else {
				b.advance("x", store.ActiveTransition{Ref: claimed["a"].Ref(), To: task.Failed})
				if got := b.statuses(p); got != "a=failed b=running c=cancelled d=pending e=pending" {
					t.Fatalf("after a failed, with d waiting for b: %s", got)
				}
				b.advance("x", store.ActiveTransition{Ref: claimed["b"].Ref(), To: task.Succeeded})
				if got := b.statuses(p); got != "a=failed b=succeeded c=cancelled d=queued e=pending" {
					t.Fatalf("after b succeeded: %s", got)
				}
			}
			claimed = map[string]*task.Task{}
			for _, tk := range b.claim("x", held, 10) {
				claimed[tk.Step] = tk
			}
			b.advance("x", store.ActiveTransition{Ref: claimed["d"].Ref(), To: task.Succeeded})
			if got := b.statuses(p); got != "a=failed b=succeeded c=cancelled d=succeeded e=queued" {
				t.Fatalf("after d succeeded: %s", got)
			}
			for _, s := range b.getPipeline(p.ID).Steps {
				checkTrail(b, s.Task.ID)
			}
		}
	})

	t.Run("ARetriedStepIsBornAsItsPolicySays", func(t *testing.T) {
		// A retry creates steps whose dependency outside the retry has
		// ended already: each is born skipped when its policy refuses
		// that end, and what lies behind it with it, exactly as it is
		// skipped when the end comes later; otherwise it waits.
		for _, on := range []string{task.OnSuccess, task.OnFailure, task.OnAny} {
			for _, end := range []task.Status{task.Failed, task.Cancelled, task.Skipped} {
				t.Run(on+"/"+string(end), func(t *testing.T) {
					b := setup(t, h)
					child := step("child", "r")
					child.DependsOn = append(child.DependsOn, task.Dependency{Step: "dep", On: on})
					p := b.pipeline("retry-birth", step("g"), step("dep", "g"), step("r"), child, step("gc", "child"))
					ends := map[string]task.Status{"r": task.Failed}
					switch end {
					case task.Skipped:
						ends["g"] = task.Failed
					case task.Cancelled:
						dep := stepTask(t, p, "dep")
						if _, err := b.s.Transition(b.ctx, store.Transition{ID: dep.ID, Version: dep.StatusVersion, To: task.Cancelled}); err != nil {
							t.Fatal(err)
						}
					default:
						ends["dep"] = end
					}
					b.drive(p, ends)
					if got := stepTask(t, b.getPipeline(p.ID), "dep").Status; got != end {
						t.Fatalf("dep is %s, want %s", got, end)
					}
					after, err := b.s.RetryPipeline(b.ctx, p.ID, "r")
					if err != nil {
						t.Fatal(err)
					}
					want := "child=pending gc=pending"
					if !task.Accepts(on, end) {
						want = "child=skipped gc=skipped"
					}
					if got := stepStatuses(after, "child", "gc"); got != want {
						t.Fatalf("born %s, want %s", got, want)
					}
					checkBirthReasons(b, after, on, end)
					b.drive(after, nil)
					if task.Accepts(on, end) {
						want = "child=succeeded gc=succeeded"
					}
					if got := stepStatuses(b.getPipeline(p.ID), "child", "gc"); got != want {
						t.Fatalf("once run: %s, want %s", got, want)
					}
				})
			}
		}
		// A retry from the step itself, whose dependency ended in a way
		// its policy accepts: it is born queued.
		for _, tc := range []struct {
			on  string
			end task.Status
		}{{task.OnFailure, task.Failed}, {task.OnAny, task.Failed}, {task.OnAny, task.Cancelled}, {task.OnFailure, task.Cancelled}} {
			t.Run("queued/"+tc.on+"/"+string(tc.end), func(t *testing.T) {
				b := setup(t, h)
				child := step("child")
				child.DependsOn = []task.Dependency{{Step: "dep", On: tc.on}}
				p := b.pipeline("retry-queued", step("dep"), child, step("gc", "child"))
				ends := map[string]task.Status{"child": task.Failed}
				if tc.end == task.Cancelled {
					dep := stepTask(t, p, "dep")
					if _, err := b.s.Transition(b.ctx, store.Transition{ID: dep.ID, Version: dep.StatusVersion, To: task.Cancelled}); err != nil {
						t.Fatal(err)
					}
				} else {
					ends["dep"] = tc.end
				}
				b.drive(p, ends)
				if got := b.statuses(p); got != "dep="+string(tc.end)+" child=failed gc=skipped" {
					t.Fatalf("before the retry: %s", got)
				}
				after, err := b.s.RetryPipeline(b.ctx, p.ID, "child")
				if err != nil {
					t.Fatal(err)
				}
				if got := stepStatuses(after, "child", "gc"); got != "child=queued gc=pending" {
					t.Fatalf("born %s, want child queued and gc pending", got)
				}
			})
		}
	})

	t.Run("AnAppendedStepIsBornAsItsPolicySays", func(t *testing.T) {
		// Steps appended with their appender's end are born as the
		// policy they name it with says of that end: queued, or skipped
		// with what lies behind them.
		for _, on := range []string{task.OnSuccess, task.OnFailure, task.OnAny} {
			for _, end := range []task.Status{task.Succeeded, task.Failed, task.Stopped} {
				t.Run(on+"/"+string(end), func(t *testing.T) {
					b := setup(t, h)
					p := b.pipeline("append-birth", step("dep"))
					held := b.hold("driver", p.Bucket)
					claimed := b.claim("driver", held, 10)
					if len(claimed) != 1 {
						t.Fatalf("claimed %d, want dep", len(claimed))
					}
					child := step("child")
					child.DependsOn = []task.Dependency{{Step: "dep", On: on}}
					// Every appended step depends on its appender: gc on
					// any end of it, so that only child decides for gc.
					gc := step("gc", "child")
					gc.DependsOn = append(gc.DependsOn, task.Dependency{Step: "dep", On: task.OnAny})
					out := b.advance("driver", store.ActiveTransition{Ref: claimed[0].Ref(), To: end,
						Append: []task.Step{child, gc}})
					if out.Err != nil || out.Status != end {
						t.Fatalf("ending dep %s with an append: %+v", end, out)
					}
					after := b.getPipeline(p.ID)
					want := "child=queued gc=pending"
					if !task.Accepts(on, end) {
						want = "child=skipped gc=skipped"
					}
					if got := stepStatuses(after, "child", "gc"); got != want {
						t.Fatalf("born %s, want %s", got, want)
					}
					checkBirthReasons(b, after, on, end)
					b.drive(after, nil)
					if task.Accepts(on, end) {
						want = "child=succeeded gc=succeeded"
					}
					if got := stepStatuses(b.getPipeline(p.ID), "child", "gc"); got != want {
						t.Fatalf("once run: %s, want %s", got, want)
					}
				})
			}
		}
	})

	t.Run("InvalidPipelinesWriteNothing", func(t *testing.T) {
		b := setup(t, h)
		for name, steps := range map[string][]task.Step{
			"empty":     nil,
			"unknown":   {step("a", "nope")},
			"duplicate": {step("a"), step("a")},
			"cycle":     {step("a", "c"), step("b", "a"), step("c", "b")},
			"policy":    {step("a"), {Name: "b", Kind: "noop", DependsOn: []task.Dependency{{Step: "a", On: "sometimes"}}}},
		} {
			_, err := b.s.CreatePipeline(b.ctx, store.NewPipeline{Name: name, Steps: steps})
			if !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: %v, want store.ErrInvalid", name, err)
			}
		}
		// A step is refused for what a submitted task is refused for, and
		// with the same typed error (store.CheckNewTasks).
		with := func(f func(*task.Step)) []task.Step {
			s := step("a")
			f(&s)
			return []task.Step{s}
		}
		for name, np := range map[string]store.NewPipeline{
			"payload over 1 MiB": {Steps: with(func(s *task.Step) {
				s.Payload = json.RawMessage(`"` + strings.Repeat("x", store.MaxPayloadBytes) + `"`)
			})},
			"max attempts over the bound":   {Steps: with(func(s *task.Step) { s.MaxAttempts = store.MaxMaxAttempts + 1 })},
			"kind with a control character": {Steps: with(func(s *task.Step) { s.Kind = "no\x07op" })},
			"priority beyond int32":         {Steps: with(func(s *task.Step) { s.Priority = store.MaxPriority + 1 })},
			"key of 600 bytes":              {Key: strings.Repeat("k", 600), Steps: []task.Step{step("a")}},
			"step name with a newline":      {Steps: with(func(s *task.Step) { s.Name = "a\nb" })},
		} {
			np.Name = name
			_, err := b.s.CreatePipeline(b.ctx, np)
			var invalid *store.InvalidError
			if !errors.As(err, &invalid) {
				t.Errorf("%s: %v, want a *store.InvalidError as a task would get", name, err)
			}
		}
		if got, err := b.s.ListTasks(b.ctx, store.TaskFilter{}); err != nil || len(got) != 0 {
			t.Errorf("invalid pipelines left %d tasks (%v)", len(got), err)
		}
		if _, err := b.s.GetPipeline(b.ctx, 1_000_000); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a missing pipeline: %v, want store.ErrNotFound", err)
		}
	})
}

func step(name string, deps ...string) task.Step {
	s := task.Step{Name: name, Kind: "noop", MaxAttempts: 1}
	for _, d := range deps {
		s.DependsOn = append(s.DependsOn, task.Dependency{Step: d})
	}
	return s
}

func (b *testBundle) pipeline(name string, steps ...task.Step) store.Pipeline {
	b.t.Helper()
	return b.pipelineKey(name, "", steps...)
}

func (b *testBundle) pipelineKey(name, key string, steps ...task.Step) store.Pipeline {
	b.t.Helper()
	p, err := b.s.CreatePipeline(b.ctx, store.NewPipeline{Name: name, Key: key, Steps: steps})
	if err != nil {
		b.t.Fatalf("CreatePipeline(%s): %v", name, err)
	}
	if len(p.Steps) != len(steps) {
		b.t.Fatalf("CreatePipeline(%s) answered %d steps for %d", name, len(p.Steps), len(steps))
	}
	return p
}

func (b *testBundle) getPipeline(id int64) store.Pipeline {
	b.t.Helper()
	p, err := b.s.GetPipeline(b.ctx, id)
	if err != nil {
		b.t.Fatalf("GetPipeline(%d): %v", id, err)
	}
	return p
}

// drive runs the pipeline's steps as a node would, ending each as ends
// says (succeeded by default), until nothing is left to claim; then it
// checks every step's trail.
func (b *testBundle) drive(p store.Pipeline, ends map[string]task.Status) {
	b.t.Helper()
	held := b.hold("driver", p.Bucket)
	for {
		claimed := b.claim("driver", held, 100)
		if len(claimed) == 0 {
			break
		}
		for _, tk := range claimed {
			to := task.Succeeded
			if end, ok := ends[tk.Step]; ok {
				to = end
			}
			if out := b.advance("driver", store.ActiveTransition{Ref: tk.Ref(), To: to}); out.Err != nil {
				b.t.Fatalf("ending step %s: %v", tk.Step, out.Err)
			}
		}
	}
	for _, s := range b.getPipeline(p.ID).Steps {
		checkTrail(b, s.Task.ID)
	}
}

// statuses is "name=status ..." of the pipeline's steps as stored now.
func (b *testBundle) statuses(p store.Pipeline) string {
	b.t.Helper()
	var out []string
	for _, s := range b.getPipeline(p.ID).Steps {
		out = append(out, s.Name+"="+string(s.Task.Status))
	}
	return strings.Join(out, " ")
}

func stepTask(t *testing.T, p store.Pipeline, name string) *task.Task {
	t.Helper()
	s, ok := p.Step(name)
	if !ok {
		t.Fatalf("pipeline %d has no step %s", p.ID, name)
	}
	return s.Task
}

func names(ts []*task.Task) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Step
	}
	return strings.Join(out, " ")
}

func sameJSON(got json.RawMessage, want string) bool {
	var a, b any
	return json.Unmarshal(got, &a) == nil && json.Unmarshal([]byte(want), &b) == nil && jsonEqual(a, b)
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func stringsOf(m map[string]json.RawMessage) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// stepStatuses is "name=status ..." of the named steps of p.
func stepStatuses(p store.Pipeline, steps ...string) string {
	var out []string
	for _, name := range steps {
		st := "missing"
		if s, ok := p.Step(name); ok {
			st = string(s.Task.Status)
		}
		out = append(out, name+"="+string(st))
	}
	return strings.Join(out, " ")
}

// checkBirthReasons checks the trails of the steps child and gc of p, born
// after child's dependency dep ended in end: a skip says why as a skip
// made when the end came later does.
func checkBirthReasons(b *testBundle, p store.Pipeline, on string, end task.Status) {
	b.t.Helper()
	for name, reason := range map[string]string{
		"child": store.DependencyEndReason("dep", end, on),
		"gc":    store.SkippedDependencyReason("child"),
	} {
		s, _ := p.Step(name)
		evs := checkTrail(b, s.Task.ID)
		last := evs[len(evs)-1]
		if s.Task.Status == task.Skipped && (last.To != task.Skipped || last.Reason != reason) {
			b.t.Errorf("%s was born skipped with %+v, want reason %q", name, last, reason)
		}
	}
}
