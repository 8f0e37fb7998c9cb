package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func testTransition(t *testing.T, h Harness) {
	t.Run("CompareAndSet", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
		paused, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Paused, Reason: "operator"})
		if err != nil {
			t.Fatalf("queued -> paused: %v", err)
		}
		if paused.Status != task.Paused || paused.StatusVersion != 2 {
			t.Errorf("after the move: %s v%d, want paused v2", paused.Status, paused.StatusVersion)
		}
		// A second writer that read version 1 loses.
		_, err = b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Cancelled})
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("stale compare-and-set: %v, want store.ErrConflict", err)
		}
		if got := b.get(created.ID); got.Status != task.Paused || got.StatusVersion != 2 {
			t.Errorf("a lost compare-and-set changed the task: %s v%d", got.Status, got.StatusVersion)
		}
		_, err = b.s.Transition(b.ctx, store.Transition{ID: created.ID + 100, Version: 1, To: task.Cancelled})
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing task: %v, want store.ErrNotFound", err)
		}
	})

	t.Run("TheTableIsEnforced", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
		_, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Succeeded})
		var te *task.TransitionError
		if !errors.As(err, &te) || te.From != task.Queued || te.To != task.Succeeded {
			t.Fatalf("queued -> succeeded: %v, want *task.TransitionError", err)
		}
		cancelled, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Cancelled})
		if err != nil {
			t.Fatal(err)
		}
		if cancelled.FinishedAt.IsZero() {
			t.Error("a terminal task has no finished_at")
		}
		_, err = b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 2, To: task.Queued})
		if !errors.As(err, &te) {
			t.Errorf("cancelled -> queued: %v, want *task.TransitionError", err)
		}
		if len(events(b, created.ID)) != 2 {
			t.Error("a refused transition wrote an event")
		}
	})

	t.Run("AResumeCanWaitForTheRestOfADelay", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1, Delay: time.Hour})[0]
		paused, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Paused})
		if err != nil {
			t.Fatal(err)
		}
		if !paused.RunAt.Equal(created.RunAt) {
			t.Errorf("pause moved run_at from %v to %v", created.RunAt, paused.RunAt)
		}
		now, _ := b.s.Now(b.ctx)
		left := created.RunAt.Sub(now)
		resumed, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: paused.StatusVersion,
			To: task.Scheduled, Delay: left})
		if err != nil {
			t.Fatal(err)
		}
		if resumed.Status != task.Scheduled || resumed.RunAt.Before(created.RunAt.Add(-time.Minute)) {
			t.Errorf("resumed to %s at %v, want scheduled at about %v", resumed.Status, resumed.RunAt, created.RunAt)
		}
		if got := b.claim("a", b.hold("a", 1), 10); len(got) != 0 {
			t.Errorf("a task resumed to wait for its delay was claimed: %v", ids(got))
		}
	})

	t.Run("ResumeQueuesNowRetryWaitsForItsDelay", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1, Delay: time.Hour})[0]
		paused, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: 1, To: task.Paused})
		if err != nil {
			t.Fatal(err)
		}
		now, _ := b.s.Now(b.ctx)
		queued, err := b.s.Transition(b.ctx, store.Transition{ID: created.ID, Version: paused.StatusVersion, To: task.Queued})
		if err != nil {
			t.Fatal(err)
		}
		if queued.RunAt.After(now.Add(time.Minute)) {
			t.Errorf("a resumed task runs at %v, want about %v", queued.RunAt, now)
		}
	})

	t.Run("GuardRequiresTheBucketLease", func(t *testing.T) {
		b := setup(t, h)
		running, held := b.runningTask("a", 2)
		h.ExpireTaskLease(t, b.s, running.ID)

		// A node that does not hold the bucket cannot rescue the task.
		_, err := b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: running.StatusVersion,
			To: task.Retrying, Guard: &store.LeaseGuard{Owner: "b", Epoch: held[0].Epoch}})
		if !errors.Is(err, store.ErrFenced) {
			t.Fatalf("rescue by a non-holder: %v, want store.ErrFenced", err)
		}
		_, err = b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: running.StatusVersion,
			To: task.Retrying, Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch + 1}})
		if !errors.Is(err, store.ErrFenced) {
			t.Fatalf("rescue under a wrong epoch: %v, want store.ErrFenced", err)
		}
		rescued, err := b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: running.StatusVersion,
			To: task.Retrying, Reason: "lease expired", Delay: time.Hour,
			Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch}})
		if err != nil {
			t.Fatalf("rescue by the holder: %v", err)
		}
		if rescued.Status != task.Retrying || rescued.Owner != "" || !rescued.LeaseExpiresAt.IsZero() {
			t.Errorf("rescued task: %s owner %q lease %v; want retrying with no owner or lease",
				rescued.Status, rescued.Owner, rescued.LeaseExpiresAt)
		}
		if rescued.ClaimSeq != running.ClaimSeq || rescued.Node != running.Node || rescued.Epoch != running.Epoch {
			t.Errorf("leaving running lost history: claim_seq %d node %q epoch %d", rescued.ClaimSeq, rescued.Node, rescued.Epoch)
		}
		now, _ := b.s.Now(b.ctx)
		if rescued.RunAt.Before(now.Add(59 * time.Minute)) {
			t.Errorf("retrying with a delay of an hour runs at %v (now %v)", rescued.RunAt, now)
		}

		// An expired bucket lease is no lease: the guard refuses it too.
		running2, held2 := b.runningTask("a", 3)
		h.ExpireBucketLease(t, b.s, 3)
		_, err = b.s.Transition(b.ctx, store.Transition{ID: running2.ID, Version: running2.StatusVersion,
			To: task.Retrying, Guard: &store.LeaseGuard{Owner: "a", Epoch: held2[0].Epoch}})
		if !errors.Is(err, store.ErrFenced) {
			t.Errorf("rescue under an expired bucket lease: %v, want store.ErrFenced", err)
		}
	})

	t.Run("APendingStopWinsOverARetry", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop, IssuedBy: "ops"}); err != nil {
			t.Fatal(err)
		}
		out := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Retrying, Error: "boom"})
		if out.Err != nil || out.Status != task.Stopped {
			t.Fatalf("retry with a stop pending: %+v, want stopped", out)
		}

		// Via reconcile's path too: lost becomes stopped.
		running2, held := b.runningTask("a", 2)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running2.ID, Kind: store.CommandStop}); err != nil {
			t.Fatal(err)
		}
		got, err := b.s.Transition(b.ctx, store.Transition{ID: running2.ID, Version: running2.StatusVersion, To: task.Lost,
			Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch}})
		if err != nil || got.Status != task.Stopped {
			t.Fatalf("lost with a stop pending: %v %v, want stopped", got, err)
		}

		// Work that finished before the stop was seen is recorded truthfully.
		running3, _ := b.runningTask("a", 3)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running3.ID, Kind: store.CommandStop}); err != nil {
			t.Fatal(err)
		}
		out = b.advance("a", store.ActiveTransition{Ref: running3.Ref(), To: task.Stopping})
		if out.Err != nil || out.Status != task.Stopping {
			t.Fatalf("running -> stopping: %+v", out)
		}
		out = b.advance("a", store.ActiveTransition{Ref: running3.Ref(), To: task.Succeeded})
		if out.Err != nil || out.Status != task.Succeeded {
			t.Fatalf("stopping -> succeeded: %+v", out)
		}

		// A stop that arrives while a pause is pending wins over the pause.
		running5, _ := b.runningTask("a", 5)
		b.advance("a", store.ActiveTransition{Ref: running5.Ref(), To: task.Pausing})
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running5.ID, Kind: store.CommandStop}); err != nil {
			t.Fatal(err)
		}
		out = b.advance("a", store.ActiveTransition{Ref: running5.Ref(), To: task.Paused, Reason: "checkpoint"})
		if out.Err != nil || out.Status != task.Stopped {
			t.Fatalf("pausing task checkpointing with a stop pending: %+v, want stopped", out)
		}
		checkTrail(b, running5.ID)

		// A stopping task that fails is stopped, not failed or retried.
		running4, _ := b.runningTask("a", 4)
		b.advance("a", store.ActiveTransition{Ref: running4.Ref(), To: task.Stopping})
		out = b.advance("a", store.ActiveTransition{Ref: running4.Ref(), To: task.Failed, Error: "context canceled"})
		if out.Err != nil || out.Status != task.Stopped {
			t.Fatalf("stopping task that failed: %+v, want stopped", out)
		}
	})

	t.Run("ReleaseDoesNotCountTheAttempt", func(t *testing.T) {
		b := setup(t, h)
		running, held := b.runningTask("a", 1)
		out := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Queued, Reason: "shutdown"})
		if out.Err != nil || out.Status != task.Queued {
			t.Fatalf("release: %+v", out)
		}
		released := b.get(running.ID)
		if released.Attempt != 0 || released.ClaimSeq != 1 || released.Owner != "" {
			t.Errorf("released: attempt %d claim_seq %d owner %q; want 0, 1, none", released.Attempt, released.ClaimSeq, released.Owner)
		}
		again := b.claim("a", held, 1)
		if len(again) != 1 || again[0].Attempt != 1 || again[0].ClaimSeq != 2 {
			t.Fatalf("reclaimed: %+v; want attempt 1 and claim_seq 2", again)
		}
	})

	t.Run("BatchAnswersInInputOrder", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1})
		held := b.hold("a", 1)
		claimed := b.claim("a", held, 3)
		if len(claimed) != 3 {
			t.Fatalf("claimed %d", len(claimed))
		}
		stale := claimed[1].Ref()
		stale.ClaimSeq--
		batch := []store.ActiveTransition{
			{Ref: claimed[2].Ref(), To: task.Succeeded, Result: []byte(`{"n":2}`)},
			{Ref: stale, To: task.Succeeded},
			{Ref: task.Ref{ID: claimed[2].ID + 100, ClaimSeq: 1}, To: task.Succeeded},
			{Ref: claimed[0].Ref(), To: task.Failed, Error: "bad input"},
		}
		out, err := b.s.AdvanceActive(b.ctx, "a", batch)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 4 {
			t.Fatalf("%d outcomes for 4 transitions", len(out))
		}
		if out[0].ID != claimed[2].ID || out[0].Err != nil || out[0].Status != task.Succeeded {
			t.Errorf("outcome 0: %+v", out[0])
		}
		if !errors.Is(out[1].Err, store.ErrFenced) || out[1].Status != task.Running {
			t.Errorf("outcome 1 (stale claim_seq): %+v, want fenced and still running", out[1])
		}
		if !errors.Is(out[2].Err, store.ErrNotFound) {
			t.Errorf("outcome 2 (missing task): %+v", out[2])
		}
		if out[3].Err != nil || out[3].Status != task.Failed {
			t.Errorf("outcome 3: %+v", out[3])
		}
		done := b.get(claimed[2].ID)
		if string(done.Result) != `{"n": 2}` && string(done.Result) != `{"n":2}` {
			t.Errorf("result read back as %s", done.Result)
		}
		if done.FinishedAt.IsZero() || done.Owner != "" {
			t.Errorf("succeeded task: finished %v owner %q", done.FinishedAt, done.Owner)
		}
		if failed := b.get(claimed[0].ID); failed.Error != "bad input" {
			t.Errorf("failed task error %q", failed.Error)
		}
		// A move the table forbids is refused even with a valid fence.
		out2, err := b.s.AdvanceActive(b.ctx, "a", []store.ActiveTransition{{Ref: claimed[1].Ref(), To: task.Cancelled}})
		if err != nil {
			t.Fatal(err)
		}
		var te *task.TransitionError
		if !errors.As(out2[0].Err, &te) {
			t.Errorf("running -> cancelled: %+v, want *task.TransitionError", out2[0])
		}
	})
}
