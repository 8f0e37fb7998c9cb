package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func testClaim(t *testing.T, h Harness) {
	t.Run("StampsTheClaim", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 3})[0]
		held := b.hold("a", 3)
		now, _ := b.s.Now(b.ctx)
		claimed := b.claim("a", held, 10)
		if len(claimed) != 1 {
			t.Fatalf("claimed %d tasks, want 1", len(claimed))
		}
		c := claimed[0]
		if c.ID != created.ID || c.Status != task.Running || c.ClaimSeq != 1 || c.Attempt != 1 ||
			c.Owner != "a" || c.Node != "node-a" || c.Epoch != held[0].Epoch || c.StatusVersion != 2 {
			t.Errorf("claimed task %+v", c)
		}
		if d := c.LeaseExpiresAt.Sub(now); d < leaseTTL-5*time.Second || d > leaseTTL+5*time.Second {
			t.Errorf("task lease expires %v after now, want about %v", d, leaseTTL)
		}
		if c.StartedAt.IsZero() {
			t.Error("no started_at")
		}
		if again := b.claim("a", held, 10); len(again) != 0 {
			t.Errorf("a running task was claimed again: %v", ids(again))
		}
	})

	t.Run("NothingWithoutTheLease", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 2})
		heldA := b.hold("a", 1, 2)

		// Another's lease: b names a's epoch but is not the holder.
		if got := b.claim("b", heldA, 10); len(got) != 0 {
			t.Errorf("a claim in another's bucket returned %v", ids(got))
		}
		// The holder naming a wrong epoch gets nothing either.
		wrong := []store.HeldBucket{{Bucket: 1, Epoch: heldA[0].Epoch + 1}}
		if got := b.claim("a", wrong, 10); len(got) != 0 {
			t.Errorf("a claim under a wrong epoch returned %v", ids(got))
		}
		// An expired lease is no lease, even for the holder.
		h.ExpireBucketLease(t, b.s, 1)
		if got := b.claim("a", heldA[:1], 10); len(got) != 0 {
			t.Errorf("a claim under an expired lease returned %v", ids(got))
		}
		if got := b.claim("a", heldA[1:], 10); len(got) != 1 || got[0].Bucket != 2 {
			t.Errorf("the live bucket beside it: %v", ids(got))
		}
	})

	t.Run("OnlyTheGivenBucketsAndKinds", func(t *testing.T) {
		b := setup(t, h)
		b.create(
			store.NewTask{Kind: "email", Key: "k", Bucket: 1},
			store.NewTask{Kind: "resize", Key: "k", Bucket: 1},
			store.NewTask{Kind: "email", Key: "k", Bucket: 2},
		)
		held := b.hold("a", 1, 2)
		if got := b.claim("a", held[:1], 10, "email"); len(got) != 1 || got[0].Kind != "email" || got[0].Bucket != 1 {
			t.Fatalf("claim of email in bucket 1: %+v", got)
		}
		if got, err := b.s.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "a", Buckets: held, Limit: 10, LeaseTTL: leaseTTL}); err != nil || len(got) != 0 {
			t.Errorf("a claim naming no kinds returned %v (%v)", ids(got), err)
		}
		if got := b.claim("a", held, 10, "email", "resize"); len(got) != 2 {
			t.Errorf("the rest: %v", ids(got))
		}
	})

	t.Run("NothingFromTheBucketsBetweenTheHeldOnes", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "k", Bucket: 1, Priority: 1},
			store.NewTask{Key: "k", Bucket: 2, Priority: 9},
			store.NewTask{Key: "k", Bucket: 3},
		)
		held := b.hold("a", 1, 3)
		if got := b.claim("a", held, 10); !slices.Equal(ids(got), []int64{created[0].ID, created[2].ID}) {
			t.Errorf("holding 1 and 3, claimed %v, want %v", ids(got), []int64{created[0].ID, created[2].ID})
		}
	})

	t.Run("PriorityThenFIFO", func(t *testing.T) {
		b := setup(t, h)
		var batch []store.NewTask
		for i, p := range []int{0, 5, 0, 10, 5, 0} {
			batch = append(batch, store.NewTask{Key: fmt.Sprint(i), Bucket: i % 3, Priority: p})
		}
		created := b.create(batch...)
		held := b.hold("a", 0, 1, 2)
		var order []int64
		for {
			got := b.claim("a", held, 2)
			if len(got) == 0 {
				break
			}
			order = append(order, ids(got)...)
		}
		want := []int64{created[3].ID, created[1].ID, created[4].ID, created[0].ID, created[2].ID, created[5].ID}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Errorf("claim order %v, want %v (priority first, then submit order)", order, want)
		}
	})

	t.Run("DueScheduledAndRetryingIncluded", func(t *testing.T) {
		b := setup(t, h)
		later := b.create(store.NewTask{Key: "k", Bucket: 1, Delay: time.Hour})[0]
		// Due after the first claim: a loaded machine takes long over the
		// statements in between, hence the delay stretched for it.
		soon := b.create(store.NewTask{Key: "k", Bucket: 1, Delay: patience.Scale(2 * time.Second).Round(time.Second)})[0]
		held := b.hold("a", 1)
		if got := b.claim("a", held, 10); len(got) != 0 {
			t.Fatalf("tasks claimed before they were due: %v", ids(got))
		}
		eventually(t, 30*time.Second, "the store clock passes the scheduled run_at", func() bool {
			now, err := b.s.Now(b.ctx)
			return err == nil && now.After(soon.RunAt)
		})
		got := b.claim("a", held, 10)
		if len(got) != 1 || got[0].ID != soon.ID {
			t.Fatalf("claimed %v once due, want only %d (not %d)", ids(got), soon.ID, later.ID)
		}
		out := b.advance("a", store.ActiveTransition{Ref: got[0].Ref(), To: task.Retrying, Error: "flaky"})
		if out.Err != nil || out.Status != task.Retrying {
			t.Fatalf("running -> retrying: %+v", out)
		}
		again := b.claim("a", held, 10)
		if len(again) != 1 || again[0].ID != soon.ID || again[0].Attempt != 2 || again[0].ClaimSeq != 2 {
			t.Fatalf("due retry: %+v, want attempt 2 and claim_seq 2", again)
		}
		retry := b.advance("a", store.ActiveTransition{Ref: again[0].Ref(), To: task.Retrying, Delay: time.Hour})
		if retry.Err != nil {
			t.Fatal(retry.Err)
		}
		if got := b.claim("a", held, 10); len(got) != 0 {
			t.Errorf("a retry claimed before its backoff: %v", ids(got))
		}
	})

	t.Run("NeverTheSameTaskTwice", func(t *testing.T) {
		// Smaller under -short, never skipped: the rule holds at any size.
		total, claimers := 10000, 8
		if testing.Short() || h.OneWriter {
			total = 1000
		}
		b := setup(t, h)
		var batch []store.NewTask
		for i := 0; i < total; i++ {
			batch = append(batch, store.NewTask{Key: fmt.Sprint(i), Bucket: i % numBuckets})
		}
		for start := 0; start < total; start += 2000 {
			b.create(batch[start:min(start+2000, total)]...)
		}
		all := make([]int, numBuckets)
		for i := range all {
			all[i] = i
		}
		held := b.hold("a", all...)

		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		errs := make(chan error, claimers)
		for c := 0; c < claimers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					got, err := b.s.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "a", Node: "node-a", Buckets: held,
						Kinds: []string{"noop"}, Limit: 50, LeaseTTL: leaseTTL})
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, t := range got {
						seen[t.ID]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent claim: %v", err)
		}
		if len(seen) != total {
			t.Errorf("claimed %d distinct tasks, want %d", len(seen), total)
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("task %d claimed %d times", id, n)
			}
		}
	})
}
