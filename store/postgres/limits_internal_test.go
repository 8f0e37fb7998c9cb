package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// TestLimitedClaimFinishesWellWithinItsTimeout: a limited claim over 1,200
// queued tasks of 30 limit keys, with a deadline that gives the statement
// 500 ms (ClaimLimited sets half the caller's time left), takes its tasks.
// It takes about 10 ms; under claimSettingSQL's enable_sort off it took two
// seconds and was cancelled, and a fleet with limits claimed nothing.
func TestLimitedClaimFinishesWellWithinItsTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	nts := make([]store.NewTask, 1200)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "noop", Key: fmt.Sprintf("k%d", i), LimitKey: fmt.Sprintf("tenant-%d", i%30), Bucket: i % 64}
	}
	if _, err := s.CreateTasks(ctx, nts); err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "a", Buckets: bucket.All(64), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held := make([]store.HeldBucket, len(leases))
	for i, l := range leases {
		held[i] = store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch}
	}
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	defer ccancel()
	got, err := s.ClaimLimited(cctx, store.ClaimRequest{Owner: "a", Node: "a", Buckets: held, Kinds: []string{"noop"},
		Limit: 98, LeaseTTL: time.Minute}, store.LimitedClaim{
		Kinds: []store.KindRoom{{Kind: "noop", Room: -1, KeyRoom: 2}},
	})
	if err != nil {
		t.Fatalf("the limited claim: %v", err)
	}
	if len(got) != 60 {
		t.Errorf("claimed %d, want 2 of each of the 30 keys", len(got))
	}
}

// TestFleetLimitedClaimsTakeNoLockOfTheLimit: while another transaction
// holds the row of a fleet-wide limit, as every holder's share take does
// for a moment, the limited claim and the write of an outcome with its
// claim go through, and only a share take waits. A limit shared by the
// fleet costs its claims no lock that other nodes hold.
func TestFleetLimitedClaimsTakeNoLockOfTheLimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	if _, err := s.UpsertLimit(ctx, store.Limit{Name: "train", Kind: "noop", Per: store.PerFleet, Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	nts := make([]store.NewTask, 6)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "noop", Key: fmt.Sprintf("k%d", i), Bucket: 3}
	}
	if _, err := s.CreateTasks(ctx, nts); err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "a", Buckets: bucket.Of(3), TTL: time.Minute})
	if err != nil || len(leases) != 1 {
		t.Fatalf("acquire: %v, %v", leases, err)
	}
	held := []store.HeldBucket{{Bucket: 3, Epoch: leases[0].Epoch}}

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flotilla_limits WHERE name = 'train' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// A share take queues on the row: it is still waiting when its
	// deadline ends.
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s.TakeShare(sctx, store.ShareRequest{Limit: "train", Owner: "a", Node: "a", MaxDemand: 4,
		Buckets: []int{3}, TTL: time.Minute})
	scancel()
	if err == nil {
		t.Fatal("a share take went through while another transaction held the limit's row; the test locks nothing")
	}

	lc := store.LimitedClaim{Kinds: []store.KindRoom{{Kind: "noop", Room: 2, KeyRoom: -1}}}
	req := store.ClaimRequest{Owner: "a", Node: "a", Buckets: held, Kinds: []string{"noop"}, Limit: 2, LeaseTTL: time.Minute}
	claimed, err := s.ClaimLimited(ctx, req, lc)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("the limited claim beside the locked limit: %d tasks, %v; want 2", len(claimed), err)
	}
	end := []store.ActiveTransition{{Ref: claimed[0].Ref(), To: "succeeded", Node: "a"}}
	req.Limit = 1
	lc.Kinds[0].Room = 1
	outcomes, more, err := s.AdvanceAndClaimLimited(ctx, "a", end, req, lc)
	if err != nil || len(outcomes) != 1 || outcomes[0].Err != nil || len(more) != 1 {
		t.Fatalf("an outcome with its claim beside the locked limit: %+v, %d claimed, %v; want 1 and 1", outcomes, len(more), err)
	}
}
