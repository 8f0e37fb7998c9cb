package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestAPruneSkipsARowAnotherTransactionHoldsAndDoesNotWait: an old finished
// task whose row an open transaction holds is left for a later pass; the
// prune removes the others at once instead of waiting for the lock, and
// takes the held one once it is free.
func TestAPruneSkipsARowAnotherTransactionHoldsAndDoesNotWait(t *testing.T) {
	t.Parallel()
	s := migrated(t, 8)
	ctx := testContext(t)
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "p", Node: "p", Buckets: bucket.Of(0), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for range 3 {
		tks, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 0}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Transition(ctx, store.Transition{ID: tks[0].ID, Version: 1, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tks[0].ID)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE flotilla_tasks SET finished_at = finished_at - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	unlock := lockTask(t, s, ids[1])
	req := store.PruneRequest{Owner: "p", Bucket: 0, Epoch: leases[0].Epoch, Retention: store.DefaultRetention()}
	// A prune that waited for the lock would outlive this deadline, which
	// the lock outlives.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := s.PruneFinished(pctx, req)
	if err != nil || res.Tasks != 2 {
		t.Fatalf("prune with task %d locked: %+v, %v; want the 2 others", ids[1], res, err)
	}
	if _, err := s.GetTask(ctx, ids[1]); err != nil {
		t.Fatalf("the locked task: %v, want it kept", err)
	}
	unlock()
	if res, err := s.PruneFinished(ctx, req); err != nil || res.Tasks != 1 {
		t.Fatalf("prune once the lock is gone: %+v, %v; want the last task", res, err)
	}
}
