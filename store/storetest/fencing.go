package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testFencing holds invariant 2: no two attempts of a task can commit. A late
// write from a superseded attempt changes nothing.
func testFencing(t *testing.T, h Harness) {
	t.Run("AnOldClaimSeqChangesNothing", func(t *testing.T) {
		b := setup(t, h)
		first, held := b.runningTask("a", 1)
		b.advance("a", store.ActiveTransition{Ref: first.Ref(), To: task.Retrying})
		second := b.claim("a", held, 1)
		if len(second) != 1 || second[0].ClaimSeq != first.ClaimSeq+1 {
			t.Fatalf("second claim: %+v", second)
		}
		out := b.advance("a", store.ActiveTransition{Ref: first.Ref(), To: task.Succeeded, Result: json.RawMessage(`"late"`)})
		if !errors.Is(out.Err, store.ErrFenced) {
			t.Fatalf("completion by the first attempt: %+v, want store.ErrFenced", out)
		}
		got := b.get(first.ID)
		if got.Status != task.Running || got.ClaimSeq != second[0].ClaimSeq || got.Result != nil {
			t.Errorf("the fenced write changed the task: %s claim_seq %d result %s", got.Status, got.ClaimSeq, got.Result)
		}
		if err := b.s.SaveProgress(b.ctx, "a", first.Ref(), json.RawMessage(`{"p":1}`)); !errors.Is(err, store.ErrFenced) {
			t.Errorf("progress from the first attempt: %v, want store.ErrFenced", err)
		}
		if err := b.s.SaveProgress(b.ctx, "a", second[0].Ref(), json.RawMessage(`{"p":2}`)); err != nil {
			t.Errorf("progress from the live attempt: %v", err)
		}
		if got := b.get(first.ID); string(got.Progress) != `{"p": 2}` && string(got.Progress) != `{"p":2}` {
			t.Errorf("progress read back as %s", got.Progress)
		}
	})

	t.Run("AnotherIncarnationChangesNothing", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		out := b.advance("a-reborn", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded})
		if !errors.Is(out.Err, store.ErrFenced) {
			t.Fatalf("completion by another incarnation: %+v, want store.ErrFenced", out)
		}
		if got := b.get(running.ID); got.Status != task.Running {
			t.Errorf("task is %s", got.Status)
		}
	})

	t.Run("ANewBucketEpochFencesTheOldAttempt", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		// a is frozen past its lease; b takes the bucket (epoch + 1).
		h.ExpireBucketLease(t, b.s, 1)
		b.hold("b", 1)
		refs, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{running.Ref()}, leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		if len(refs.Renewed) != 0 || len(refs.Busy) != 0 {
			t.Errorf("a renewed a task lease in a bucket whose epoch moved on: %+v", refs)
		}
		out := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded})
		if !errors.Is(out.Err, store.ErrFenced) {
			t.Fatalf("completion after the bucket changed hands: %+v, want store.ErrFenced", out)
		}
	})

	t.Run("SameHolderAfterExpiryIsANewEpoch", func(t *testing.T) {
		// The holder's own lease ran out and it took the bucket back: the
		// epoch moved on, and every write of the attempt it claimed under
		// the old epoch is fenced, although owner and claim_seq still match.
		for _, write := range []struct {
			name string
			do   func(b *testBundle, running *task.Task) error
		}{
			{"completion", func(b *testBundle, running *task.Task) error {
				return b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded}).Err
			}},
			{"failure", func(b *testBundle, running *task.Task) error {
				return b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Retrying, Error: "late"}).Err
			}},
			{"stopping", func(b *testBundle, running *task.Task) error {
				return b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Stopping}).Err
			}},
			{"pausing", func(b *testBundle, running *task.Task) error {
				return b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Pausing}).Err
			}},
			{"progress", func(b *testBundle, running *task.Task) error {
				return b.s.SaveProgress(b.ctx, "a", running.Ref(), json.RawMessage(`{"late":true}`))
			}},
			{"renewal", func(b *testBundle, running *task.Task) error {
				refs, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{running.Ref()}, leaseTTL)
				if err != nil {
					return err
				}
				if len(refs.Renewed) != 0 || len(refs.Busy) != 0 {
					return fmt.Errorf("renewal answered %+v", refs)
				}
				return store.ErrFenced
			}},
		} {
			t.Run(write.name, func(t *testing.T) {
				b := setup(t, h)
				running, _ := b.runningTask("a", 1)
				h.ExpireBucketLease(t, b.s, 1)
				b.hold("a", 1) // the same incarnation, back after its lease ran out
				if err := write.do(b, running); !errors.Is(err, store.ErrFenced) {
					t.Fatalf("%s of an attempt claimed under the old epoch: %v, want store.ErrFenced", write.name, err)
				}
				got := b.get(running.ID)
				if got.Status != task.Running || got.StatusVersion != running.StatusVersion ||
					got.Progress != nil || !got.LeaseExpiresAt.Equal(running.LeaseExpiresAt) {
					t.Errorf("the fenced %s changed the task: %s version %d progress %s lease %v (was %v)",
						write.name, got.Status, got.StatusVersion, got.Progress, got.LeaseExpiresAt, running.LeaseExpiresAt)
				}
			})
		}
	})

	t.Run("AnExpiredButUntakenBucketStillAcceptsItsHolder", func(t *testing.T) {
		// Nobody can have rescued the task without raising the epoch, so
		// the attempt's completion is still the only one.
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		h.ExpireBucketLease(t, b.s, 1)
		out := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded})
		if out.Err != nil || out.Status != task.Succeeded {
			t.Fatalf("completion under an expired, untaken lease: %+v", out)
		}
	})

	t.Run("RenewalNamesItsTasks", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 2})
		held := b.hold("a", 1, 2)
		claimed := b.claim("a", held, 10)
		if len(claimed) != 3 {
			t.Fatalf("claimed %d", len(claimed))
		}
		now, _ := b.s.Now(b.ctx)
		stale := claimed[2].Ref()
		stale.ClaimSeq++
		refs, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{claimed[0].Ref(), claimed[1].Ref(), stale}, 2*leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		if len(refs.Renewed) != 2 || len(refs.Busy) != 0 {
			t.Fatalf("renewed %v, want the two named with their claim_seq", refs)
		}
		for _, c := range claimed[:2] {
			got := b.get(c.ID)
			if got.LeaseExpiresAt.Before(now.Add(2*leaseTTL - 5*time.Second)) {
				t.Errorf("task %d lease %v, want about now + %v", c.ID, got.LeaseExpiresAt, 2*leaseTTL)
			}
		}
		if got := b.get(claimed[2].ID); got.LeaseExpiresAt.After(now.Add(leaseTTL + 5*time.Second)) {
			t.Errorf("a task named with a wrong claim_seq was renewed")
		}
		if refs, _ := b.s.RenewTaskLeases(b.ctx, "b", []task.Ref{claimed[0].Ref()}, leaseTTL); len(refs.Renewed) != 0 {
			t.Errorf("another owner renewed a's task: %v", refs)
		}
		// Like the claim, renewal needs a live bucket lease: a node past its
		// lease cannot extend its tasks' leases.
		h.ExpireBucketLease(t, b.s, 2)
		refs, err = b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{claimed[0].Ref(), claimed[1].Ref(), claimed[2].Ref()}, leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		if len(refs.Renewed) != 2 {
			t.Errorf("renewed %v with bucket 2's lease expired, want only the two tasks of bucket 1", refs)
		}
	})
}

// testLockedRows holds what a row locked by another transaction (an
// operator's open transaction, a slow statement) may and may not do to the
// node that owns the task: its other tasks' leases are still renewed, and
// reconcile does not wait for it.
func testLockedRows(t *testing.T, h Harness) {
	if h.LockTask == nil {
		t.Fatal("the harness has no LockTask: every store must provide one")
	}
	t.Run("RenewalSkipsALockedRowAndRenewsTheRest", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1})
		held := b.hold("a", 1)
		claimed := b.claim("a", held, 10)
		if len(claimed) != 3 {
			t.Fatalf("claimed %d", len(claimed))
		}
		now, _ := b.s.Now(b.ctx)
		unlock := h.LockTask(t, b.s, claimed[1].ID)
		refs, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{claimed[0].Ref(), claimed[1].Ref(), claimed[2].Ref()}, 2*leaseTTL)
		unlock()
		if err != nil {
			t.Fatalf("renewal with one row locked: %v", err)
		}
		if len(refs.Renewed) != 2 || len(refs.Busy) != 1 || refs.Busy[0] != claimed[1].Ref() {
			t.Fatalf("renewal with task %d locked: %+v, want the other two renewed and it busy", claimed[1].ID, refs)
		}
		for _, c := range []*task.Task{claimed[0], claimed[2]} {
			if got := b.get(c.ID); got.LeaseExpiresAt.Before(now.Add(2*leaseTTL - 5*time.Second)) {
				t.Errorf("task %d lease %v, want about now + %v", c.ID, got.LeaseExpiresAt, 2*leaseTTL)
			}
		}
		if got := b.get(claimed[1].ID); got.LeaseExpiresAt.After(now.Add(leaseTTL + 5*time.Second)) {
			t.Errorf("the locked task's lease was extended")
		}
	})

	t.Run("ATransitionThatMayNotWaitIsBusy", func(t *testing.T) {
		b := setup(t, h)
		running, held := b.runningTask("a", 1)
		h.ExpireTaskLease(t, b.s, running.ID)
		unlock := h.LockTask(t, b.s, running.ID)
		_, err := b.s.Transition(b.ctx, store.Transition{
			ID: running.ID, Version: running.StatusVersion, To: task.Retrying, NoWait: true,
			Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch},
		})
		unlock()
		if !errors.Is(err, store.ErrBusy) {
			t.Fatalf("a NoWait transition of a locked task: %v, want store.ErrBusy", err)
		}
		if got := b.get(running.ID); got.Status != task.Running || got.StatusVersion != running.StatusVersion {
			t.Errorf("the refused move changed the task: %s version %d", got.Status, got.StatusVersion)
		}
		moved, err := b.s.Transition(b.ctx, store.Transition{
			ID: running.ID, Version: running.StatusVersion, To: task.Retrying, NoWait: true,
			Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch},
		})
		if err != nil || moved.Status != task.Retrying {
			t.Fatalf("the same move once the row is free: %v %v", moved, err)
		}
	})
}
