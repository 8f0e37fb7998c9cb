package retention_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/retention"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

type testBundle struct {
	ctx context.Context
	s   *memory.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), s: memory.New()}
	t.Cleanup(b.s.Close)
	if _, err := b.s.Migrate(b.ctx, 8); err != nil {
		t.Fatal(err)
	}
	return b
}

// cancelledLongAgo creates a task in bucketNo, cancels it and moves its
// end two days back.
func (b *testBundle) cancelledLongAgo(t *testing.T, bucketNo int) int64 {
	t.Helper()
	tks, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: bucketNo}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.s.Transition(b.ctx, store.Transition{ID: tks[0].ID, Version: 1, To: task.Cancelled}); err != nil {
		t.Fatal(err)
	}
	if err := b.s.AgeFinished(tks[0].ID, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	return tks[0].ID
}

func (b *testBundle) exists(t *testing.T, id int64) bool {
	t.Helper()
	_, err := b.s.GetTask(b.ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func TestAPruneRunActsOnlyOnBucketsNoLiveNodeHolds(t *testing.T) {
	b := setup(t)
	if _, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "live/1", Node: "live",
		Buckets: bucket.Of(1), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	free0, held1, free2 := b.cancelledLongAgo(t, 0), b.cancelledLongAgo(t, 1), b.cancelledLongAgo(t, 2)
	b.cancelledLongAgo(t, 2)
	before, err := b.s.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := retention.Request{Owner: "prune/1", Node: "prune", Buckets: bucket.Of(0, 1, 2),
		Retention: store.DefaultRetention(), Batch: 1, DryRun: true}

	dry, err := retention.Prune(b.ctx, b.s, req)
	if err != nil {
		t.Fatal(err)
	}
	if dry.Total.Tasks != 3 || len(dry.Buckets) != 2 || dry.Buckets[1].Tasks != 2 || dry.Skipped[1] != "live" {
		t.Fatalf("dry run: %+v; want 3 tasks in buckets 0 and 2, bucket 1 skipped", dry)
	}
	if !b.exists(t, free0) || !b.exists(t, free2) {
		t.Fatal("a dry run removed tasks")
	}

	req.DryRun = false
	rep, err := retention.Prune(b.ctx, b.s, req)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total.Tasks != 3 || rep.Total.ByStatus[task.Cancelled].Tasks != 3 || rep.Acted.String() != "0,2" {
		t.Fatalf("run: %+v; want 3 cancelled tasks from buckets 0 and 2", rep)
	}
	if b.exists(t, free0) || b.exists(t, free2) || !b.exists(t, held1) {
		t.Fatal("the run pruned a held bucket, or left a free one")
	}
	after, err := b.s.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 2} {
		if after[n].Holder != "" || after[n].Epoch != before[n].Epoch+1 {
			t.Errorf("bucket %d after the run: holder %q epoch %d; want released, epoch %d",
				n, after[n].Holder, after[n].Epoch, before[n].Epoch+1)
		}
	}
	if after[1].Node != "live" {
		t.Errorf("bucket 1 is held by %q after the run, want the live node still", after[1].Node)
	}
}

func TestAPruneRunRefusesABadRetention(t *testing.T) {
	b := setup(t)
	_, err := retention.Prune(b.ctx, b.s, retention.Request{Owner: "p/1", Node: "p",
		Retention: store.Retention{Ages: store.Ages{task.Queued: time.Hour}}})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("a retention for queued tasks: %v, want ErrInvalid", err)
	}
	if bs, _ := b.s.ListBuckets(b.ctx); bs[0].Epoch != 0 {
		t.Errorf("a refused run took leases: bucket 0 at epoch %d", bs[0].Epoch)
	}
}
