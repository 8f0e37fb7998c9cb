package reconcile

import (
	"errors"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/task"
)

func TestTheOperatorActsOnlyWhereNobodyHolds(t *testing.T) {
	b := setup(t)
	// A dead node left a running task in bucket 1; a live node holds
	// bucket 2 and runs a task there.
	deadHeld := b.hold(t, "dead/1", 1)
	orphan := b.running(t, "dead/1", deadHeld, 1, 3)
	b.store.ExpireBucketLease(1)
	liveHeld := b.hold(t, "live/1", 2)
	busy := b.running(t, "live/1", liveHeld, 2, 3)

	req := OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(1, 2)}

	dry := req
	dry.DryRun = true
	planned, err := RunOperator(b.ctx, b.store, dry)
	if err != nil {
		t.Fatal(err)
	}
	if planned.Skipped[2] != "live" || !planned.Acted.Equal(bucket.Of(1)) || planned.Retried != 1 {
		t.Fatalf("dry run: acted %s, skipped %v, retried %d; want bucket 1 only, 2 skipped for live", planned.Acted, planned.Skipped, planned.Retried)
	}
	if got := b.get(t, orphan.ID); got.Status != task.Running {
		t.Fatalf("a dry run moved task %d to %s", orphan.ID, got.Status)
	}
	if leases, _ := b.store.ListBuckets(b.ctx); leases[1].Holder != "" || leases[1].Epoch != deadHeld[0].Epoch {
		t.Fatalf("a dry run touched bucket 1's lease: %+v", leases[1])
	}

	done, err := RunOperator(b.ctx, b.store, req)
	if err != nil {
		t.Fatal(err)
	}
	if done.Retried != 1 || len(done.Entries) != 1 || done.Entries[0].TaskID != orphan.ID || done.Skipped[2] != "live" {
		t.Fatalf("real run: %+v", done)
	}
	if got := b.get(t, orphan.ID); got.Status != task.Retrying {
		t.Errorf("orphan is %s, want retrying", got.Status)
	}
	if got := b.get(t, busy.ID); got.Status != task.Running || got.Owner != "live/1" {
		t.Errorf("the live node's task was touched: %s owned by %q", got.Status, got.Owner)
	}
	leases, _ := b.store.ListBuckets(b.ctx)
	if leases[1].Holder != "" || leases[1].Epoch != deadHeld[0].Epoch+1 {
		t.Errorf("bucket 1 after the run: %+v, want released at epoch %d", leases[1], deadHeld[0].Epoch+1)
	}
	if leases[2].Holder != "live/1" {
		t.Errorf("bucket 2's holder changed: %+v", leases[2])
	}
}

func TestTheOperatorRefusesBucketsOutsideTheFleet(t *testing.T) {
	b := setup(t)
	_, err := RunOperator(b.ctx, b.store, OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(testBuckets + 1)})
	if err == nil {
		t.Fatal("a bucket beyond the fleet was accepted")
	}
	if !errors.Is(err, bucket.ErrInvalidSet) {
		t.Errorf("error %v, want bucket.ErrInvalidSet", err)
	}
}
