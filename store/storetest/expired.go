package storetest

import (
	"fmt"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testExpired holds invariant 9's store half: the expired-lease query sees
// only the buckets it is given, and counts a task claimed under an older
// epoch of its bucket as expired.
func testExpired(t *testing.T, h Harness) {
	t.Run("OnlyTheGivenBuckets", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 2}, store.NewTask{Key: "k", Bucket: 2})
		held := b.hold("a", 1, 2)
		claimed := b.claim("a", held, 10)
		for _, c := range claimed {
			h.ExpireTaskLease(t, b.s, c.ID)
		}
		got, err := b.s.ExpiredTasks(b.ctx, held[:1], 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Bucket != 1 {
			t.Errorf("expired tasks in bucket 1: %+v", got)
		}
		got, _ = b.s.ExpiredTasks(b.ctx, held, 1)
		if len(got) != 1 {
			t.Errorf("limit 1 answered %d", len(got))
		}
	})

	t.Run("LiveLeasesAreNotExpired", func(t *testing.T) {
		b := setup(t, h)
		_, held := b.runningTask("a", 1)
		got, err := b.s.ExpiredTasks(b.ctx, held, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Errorf("a live task lease counted as expired: %v", ids(got))
		}
	})

	t.Run("AnOlderEpochCountsAsExpired", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		h.ExpireBucketLease(t, b.s, 1)
		heldB := b.hold("b", 1)
		got, err := b.s.ExpiredTasks(b.ctx, heldB, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != running.ID || got[0].Owner != "a" {
			t.Fatalf("after takeover: %+v, want a's task at once, its task lease still live", got)
		}
		// The successor rescues it under its own epoch.
		rescued, err := b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: got[0].StatusVersion,
			To: task.Retrying, Reason: fmt.Sprintf("lease of %s expired", got[0].Owner), Node: "node-b",
			Epoch: heldB[0].Epoch, Guard: &store.LeaseGuard{Owner: "b", Epoch: heldB[0].Epoch}})
		if err != nil || rescued.Status != task.Retrying {
			t.Fatalf("rescue: %v %v", rescued, err)
		}
		again := b.claim("b", heldB, 1)
		if len(again) != 1 || again[0].Attempt != 2 || again[0].Epoch != heldB[0].Epoch {
			t.Fatalf("reclaim by the successor: %+v", again)
		}
		if got, _ := b.s.ExpiredTasks(b.ctx, heldB, 100); len(got) != 0 {
			t.Errorf("the successor's own attempt counts as expired: %v", ids(got))
		}
	})

	t.Run("StoppingAndPausingAreRescuedToo", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 1})
		held := b.hold("a", 1)
		claimed := b.claim("a", held, 2)
		b.advance("a", store.ActiveTransition{Ref: claimed[0].Ref(), To: task.Stopping})
		b.advance("a", store.ActiveTransition{Ref: claimed[1].Ref(), To: task.Pausing})
		for _, c := range claimed {
			h.ExpireTaskLease(t, b.s, c.ID)
		}
		got, _ := b.s.ExpiredTasks(b.ctx, held, 100)
		if len(got) != 2 {
			t.Errorf("expired stopping/pausing tasks: %v, want both", ids(got))
		}
	})
}
