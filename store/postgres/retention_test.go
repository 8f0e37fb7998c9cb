package postgres_test

import (
	"context"
	"errors"
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

// TestAPruneLeavesAPipelineARetryHoldsWhole: a retry (or an append) holds
// its pipeline's row while it plans against the pipeline's tasks; a prune
// meanwhile neither waits for it nor removes any task of that pipeline,
// which a retry committed after would then depend on, and takes the
// pipeline whole once the row is free.
func TestAPruneLeavesAPipelineARetryHoldsWhole(t *testing.T) {
	t.Parallel()
	s := migrated(t, 8)
	ctx := testContext(t)
	p, err := s.CreatePipeline(ctx, store.NewPipeline{Name: "etl", Steps: []task.Step{
		{Name: "extract", Kind: "noop"}, {Name: "load", Kind: "noop", DependsOn: []task.Dependency{{Step: "extract"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "p", Node: "p", Buckets: bucket.Of(p.Bucket), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	extract := p.Steps[0].Task // cancelled, it skips load
	if _, err := s.Transition(ctx, store.Transition{ID: extract.ID, Version: extract.StatusVersion, To: task.Cancelled}); err != nil {
		t.Fatal(err)
	}
	plain, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: p.Bucket}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, store.Transition{ID: plain[0].ID, Version: 1, To: task.Cancelled}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE flotilla_tasks SET finished_at = finished_at - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flotilla_pipelines WHERE id = $1 FOR UPDATE`, p.ID); err != nil {
		t.Fatal(err)
	}
	req := store.PruneRequest{Owner: "p", Bucket: p.Bucket, Epoch: leases[0].Epoch, Retention: store.DefaultRetention()}
	// A prune that waited for the pipeline's row would outlive this
	// deadline, which the lock outlives.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if res, err := s.PruneFinished(pctx, req); err != nil || res.Tasks != 1 {
		t.Fatalf("prune with the pipeline's row held: %+v, %v; want the plain task alone", res, err)
	}
	if got, err := s.GetPipeline(ctx, p.ID); err != nil || len(got.Steps) != 2 {
		t.Fatalf("the held pipeline: %+v, %v; want it whole", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.PruneFinished(ctx, req); err != nil || res.Tasks != 2 {
		t.Fatalf("prune once the row is free: %+v, %v; want the pipeline's 2 tasks", res, err)
	}
	if _, err := s.GetPipeline(ctx, p.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetPipeline once pruned: %v, want ErrNotFound", err)
	}
}
