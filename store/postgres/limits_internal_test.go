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
