package reconcile

import (
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Invariant 9: reconcile touches only tasks in buckets the caller holds.
// Two nodes share one store, each holding half the fleet, every task lease
// in it expired.
func TestRescueTouchesOnlyItsOwnBuckets(t *testing.T) {
	b := setup(t)
	const low, high = "node-low/1a2b", "node-high/3c4d"
	heldLow := b.hold(t, low, 0, 1, 2, 3)
	heldHigh := b.hold(t, high, 4, 5, 6, 7)
	byBucket := map[int]*task.Task{}
	for bk := range testBuckets {
		held, owner := heldLow, low
		if bk >= 4 {
			held, owner = heldHigh, high
		}
		byBucket[bk] = b.running(t, owner, held, bk, 3)
	}
	for _, tk := range byBucket {
		b.expire(t, tk)
	}
	snapshot := func() map[int]*task.Task {
		out := map[int]*task.Task{}
		for bk, tk := range byBucket {
			out[bk] = b.get(t, tk.ID)
		}
		return out
	}

	t.Run("each node rescues only its own buckets", func(t *testing.T) {
		before := snapshot()
		rep := b.rescue(t, b.store, low, heldLow)
		if rep.Retried != 4 {
			t.Errorf("low rescued %d tasks, want its 4", rep.Retried)
		}
		for _, e := range rep.Entries {
			if e.Bucket >= 4 {
				t.Errorf("low's report has a task of bucket %d: %+v", e.Bucket, e)
			}
		}
		for bk := 4; bk < 8; bk++ {
			b.unchanged(t, before[bk])
		}

		before = snapshot()
		rep = b.rescue(t, b.store, high, heldHigh)
		if rep.Retried != 4 {
			t.Errorf("high rescued %d tasks, want its 4", rep.Retried)
		}
		for bk := range 4 {
			b.unchanged(t, before[bk]) // already rescued by low; high leaves them be
		}
		for bk := 4; bk < 8; bk++ {
			if got := b.get(t, byBucket[bk].ID); got.Status != task.Retrying {
				t.Errorf("bucket %d: task is %s, want retrying", bk, got.Status)
			}
		}
	})

	t.Run("the store refuses a bucket the caller does not hold", func(t *testing.T) {
		// A fresh attempt in bucket 5, expired, and low claiming to hold
		// bucket 5 under high's epoch: the listing trusts the request, the
		// guard of the move does not.
		tk := b.running(t, high, heldHigh, 5, 3)
		b.expire(t, tk)
		before := b.get(t, tk.ID)
		rep := b.rescue(t, b.store, low, []store.HeldBucket{{Bucket: 5, Epoch: heldHigh[1].Epoch}})
		if e := entryFor(t, rep, tk.ID); e.Outcome != OutcomeFenced || rep.Rescued() != 0 {
			t.Errorf("entry %+v, want fenced and nothing rescued", e)
		}
		b.unchanged(t, before)
	})

	t.Run("a subset of what the caller holds limits the rescue to it", func(t *testing.T) {
		a := b.running(t, low, heldLow, 0, 3)
		c := b.running(t, low, heldLow, 2, 3)
		b.expire(t, a, c)
		before := b.get(t, c.ID)
		rep := b.rescue(t, b.store, low, heldLow[:1])
		if len(rep.Entries) != 1 || rep.Entries[0].TaskID != a.ID {
			t.Errorf("report %+v, want bucket 0's task only", rep.Entries)
		}
		b.unchanged(t, before)
	})
}

// A node that holds every bucket covers every task of the fleet.
func TestANodeHoldingEveryBucketRescuesEverything(t *testing.T) {
	b := setup(t)
	const dead, all = "node-dead/1a2b", "node-all/3c4d"
	every := []int{0, 1, 2, 3, 4, 5, 6, 7}
	heldDead := b.hold(t, dead, every...)
	var tasks []*task.Task
	for _, bk := range every {
		tasks = append(tasks, b.running(t, dead, heldDead, bk, 3), b.running(t, dead, heldDead, bk, 1))
	}
	for _, bk := range every {
		if err := b.store.ExpireBucketLease(bk); err != nil {
			t.Fatal(err)
		}
	}
	held := b.hold(t, all, every...)

	rep := b.rescue(t, b.store, all, held)
	if rep.Retried != testBuckets || rep.Lost != testBuckets || len(rep.Entries) != 2*testBuckets {
		t.Errorf("report: %d retried, %d lost of %d entries; want %d and %d", rep.Retried, rep.Lost,
			len(rep.Entries), testBuckets, testBuckets)
	}
	for _, tk := range tasks {
		if got := b.get(t, tk.ID); got.Status.Active() {
			t.Errorf("task %d in bucket %d is still %s", tk.ID, tk.Bucket, got.Status)
		}
	}
}
