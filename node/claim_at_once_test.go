package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestABucketTakenIsClaimedFromAtOnce: a node claims in a bucket as soon
// as it takes it, at start or by takeover, with no wait on its poll timer
// (an hour here, far beyond the test's deadline).
func TestABucketTakenIsClaimedFromAtOnce(t *testing.T) {
	t.Run("at start", func(t *testing.T) {
		b := setup(t)
		var backlog []store.NewTask
		for _, key := range b.keysIn(bucket.Of(span(0, 31)...), 20) {
			backlog = append(backlog, store.NewTask{Kind: "work", Key: key, Bucket: b.policy.Of(key)})
		}
		ids, err := b.store.CreateTasks(b.ctx, backlog)
		if err != nil {
			t.Fatal(err)
		}
		cfg := b.config(t, "starter", span(0, 31)...)
		cfg.PollInterval = time.Hour
		cfg.NoBalance = true
		b.startNode(t, cfg, map[string]Handler{"work": noop})
		eventually(t, "the starting node ran the waiting tasks", func() bool {
			return b.countByStatus(t)[task.Succeeded] == len(ids)
		})
	})
	t.Run("by takeover", func(t *testing.T) {
		b := setup(t)
		frozen := b.config(t, "holder", span(0, 31)...)
		frozen.BucketLeaseTTL = 2 * time.Hour
		frozen.NoBalance = true
		b.startNode(t, frozen, map[string]Handler{"other": noop})

		var ran atomic.Int64
		cfg := b.config(t, "standby", span(0, 31)...)
		cfg.PollInterval = time.Hour
		// No periodic pass of its own (the heartbeat's limit refresh)
		// wakes the claim loop during the test either: the takeover is
		// made by the poke below.
		cfg.BucketLeaseTTL = 2 * time.Hour
		cfg.NoBalance = true
		// Without notifications, as on a store that has none: nothing but
		// the takeover itself tells the claim loop to look.
		h := b.store.Handle()
		t.Cleanup(h.Close)
		standby := newNodeOn(t, struct{ store.Store }{h}, cfg, map[string]Handler{
			"work": func(context.Context, *task.Task) error { ran.Add(1); return nil },
		})
		if err := standby.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, key := range b.keysIn(bucket.Of(span(0, 31)...), 20) {
			ids = append(ids, submit(t, standby, SubmitRequest{Kind: "work", Key: key}).ID)
		}
		claimPassesAfter(t, standby)
		if ran.Load() != 0 {
			t.Fatalf("%d tasks ran while the holder held their buckets", ran.Load())
		}

		for bk := range 32 {
			if err := b.store.ExpireBucketLease(bk); err != nil {
				t.Fatal(err)
			}
		}
		passes := standby.claimPasses.Load()
		standby.leaseLoop.poke() // its next heartbeat, which takes the buckets
		eventually(t, "the standby ran the waiting tasks", func() bool {
			return b.countByStatus(t)[task.Succeeded] == len(ids)
		})
		if got := standby.claimPasses.Load(); got == passes {
			t.Errorf("the tasks ran with no claim pass of the standby")
		}
	})
}
