package reconcile_test

import (
	"context"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
)

// A node takes over bucket 1 from a node that died while running a task
// there, and rescues the task at once.
func ExampleRescue() {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	if _, err := s.Migrate(ctx, 4); err != nil {
		panic(err)
	}

	// node-a holds bucket 1 and runs a task there; then it dies.
	acquire := func(owner, node string) int64 {
		leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: owner, Node: node, Buckets: bucket.Of(1), TTL: time.Minute})
		if err != nil {
			panic(err)
		}
		return leases[0].Epoch
	}
	epoch := acquire("node-a/7f3e", "node-a")
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "email", Key: "tenant-9", Bucket: 1}}); err != nil {
		panic(err)
	}
	if _, err := s.ClaimTasks(ctx, store.ClaimRequest{
		Owner: "node-a/7f3e", Node: "node-a", Buckets: []store.HeldBucket{{Bucket: 1, Epoch: epoch}},
		Kinds: []string{"email"}, Limit: 1, LeaseTTL: time.Minute,
	}); err != nil {
		panic(err)
	}
	if err := s.ExpireBucketLease(1); err != nil { // as if a TTL had passed
		panic(err)
	}

	// node-b takes the bucket under the next epoch and rescues the task,
	// whose own lease has not run out yet.
	epoch = acquire("node-b/19c0", "node-b")
	report, err := reconcile.Rescue(ctx, s, reconcile.Request{
		Owner: "node-b/19c0", Node: "node-b", Buckets: []store.HeldBucket{{Bucket: 1, Epoch: epoch}},
		Backoff: func(int) time.Duration { return time.Second },
	})
	if err != nil {
		panic(err)
	}
	for _, e := range report.Entries {
		fmt.Printf("task %d (%s): %s -> %s after attempt %d: %s\n", e.TaskID, e.Kind, e.From, e.To, e.Attempt, e.Reason)
	}
	fmt.Printf("retried %d, lost %d, stopped %d\n", report.Retried, report.Lost, report.Stopped)
	// Output:
	// task 1 (email): running -> retrying after attempt 1: claimed by node-a/7f3e under epoch 1, bucket now at epoch 2
	// retried 1, lost 0, stopped 0
}
