package storetest

import (
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

func testBucketLeases(t *testing.T, h Harness) {
	acquire := func(b *testBundle, owner string, buckets ...int) map[int]store.BucketLease {
		b.t.Helper()
		leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
			Owner: owner, Node: nodeOf(owner), Buckets: bucket.Of(buckets...), TTL: leaseTTL,
		})
		if err != nil {
			b.t.Fatalf("AcquireBuckets: %v", err)
		}
		if len(leases) != len(buckets) {
			b.t.Fatalf("AcquireBuckets answered %d leases for %d buckets", len(leases), len(buckets))
		}
		out := map[int]store.BucketLease{}
		for i, l := range leases {
			if i > 0 && leases[i-1].Bucket >= l.Bucket {
				b.t.Fatalf("leases are not in ascending bucket order: %+v", leases)
			}
			out[l.Bucket] = l
		}
		return out
	}

	t.Run("TakeAFreeOneRenewOnesOwn", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		first := acquire(b, "a", 1, 2)
		for _, bn := range []int{1, 2} {
			l := first[bn]
			if !l.Held || !l.Acquired || l.Holder != "a" || l.Node != "node-a" || l.Epoch != 1 {
				t.Errorf("free bucket %d: %+v, want held and acquired by a at epoch 1", bn, l)
			}
			if d := l.ExpiresAt.Sub(now); d < leaseTTL-5*time.Second || d > leaseTTL+5*time.Second {
				t.Errorf("bucket %d expires %v after now, want about %v", bn, d, leaseTTL)
			}
		}
		renewed := acquire(b, "a", 1, 2)
		for _, bn := range []int{1, 2} {
			l := renewed[bn]
			if !l.Held || l.Acquired || l.Epoch != 1 || l.ExpiresAt.Before(first[bn].ExpiresAt) {
				t.Errorf("renewal of bucket %d: %+v, want held, not acquired, epoch 1, later expiry", bn, l)
			}
		}
	})

	t.Run("CannotTakeAnothersLiveLease", func(t *testing.T) {
		b := setup(t, h)
		acquire(b, "a", 1)
		got := acquire(b, "b", 1, 2)
		if l := got[1]; l.Held || l.Acquired || l.Holder != "a" || l.Node != "node-a" || l.Epoch != 1 {
			t.Errorf("b asking for a's bucket: %+v, want not held, holder a, epoch 1", l)
		}
		if l := got[2]; !l.Held || l.Holder != "b" {
			t.Errorf("b's free bucket in the same statement: %+v", l)
		}
		// Standing by does not disturb the holder.
		if l := acquire(b, "a", 1)[1]; !l.Held || l.Epoch != 1 || l.Acquired {
			t.Errorf("holder after a standby asked: %+v", l)
		}
	})

	t.Run("AcquisitionAfterExpiryRaisesTheEpoch", func(t *testing.T) {
		b := setup(t, h)
		acquire(b, "a", 1)
		h.ExpireBucketLease(t, b.s, 1)
		list, err := b.s.ListBuckets(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if list[1].Holder != "" || list[1].Epoch != 1 {
			t.Errorf("an expired lease is listed as %+v, want no holder", list[1])
		}
		taken := acquire(b, "b", 1)[1]
		if !taken.Held || !taken.Acquired || taken.Epoch != 2 || taken.Holder != "b" {
			t.Errorf("takeover after expiry: %+v, want b at epoch 2", taken)
		}
		// Even the same owner coming back after its own lease expired is a
		// new acquisition: what it did under epoch 2 may have been rescued.
		h.ExpireBucketLease(t, b.s, 1)
		back := acquire(b, "b", 1)[1]
		if !back.Acquired || back.Epoch != 3 {
			t.Errorf("same owner after expiry: %+v, want acquired at epoch 3", back)
		}
	})

	t.Run("ExpiryIsJudgedNoLaterThanTheRequestersReckoning", func(t *testing.T) {
		// A node reckons the database's clock on its own (JudgeAt): an
		// expiry the database's clock has passed but the reckoning has not
		// is no expiry to it, as after a failover to a primary whose clock
		// runs ahead.
		b := setup(t, h)
		first := acquire(b, "a", 1)[1]
		if first.AsOf.IsZero() {
			t.Fatal("AcquireBuckets answered no AsOf: a node cannot reckon the database's clock")
		}
		now, err := b.s.Now(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := now.Sub(first.AsOf); d < 0 || d > time.Minute {
			t.Errorf("AsOf %v, want the statement's time (now is %v)", first.AsOf, now)
		}
		h.ExpireBucketLease(t, b.s, 1)
		earlier := first.AsOf.Add(-time.Hour)
		judged := func(owner string) store.BucketLease {
			t.Helper()
			leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
				Owner: owner, Node: nodeOf(owner), Buckets: bucket.Of(1), TTL: leaseTTL, JudgeAt: earlier,
			})
			if err != nil || len(leases) != 1 {
				t.Fatalf("AcquireBuckets with JudgeAt: %v, %+v", err, leases)
			}
			return leases[0]
		}
		if l := judged("b"); l.Held || l.Holder != "a" || l.Epoch != 1 {
			t.Errorf("b judging an hour earlier: %+v, want a's lease live, not taken", l)
		}
		if l := judged("a"); !l.Held || l.Acquired || l.Epoch != 1 {
			t.Errorf("a renewing, judged an hour earlier: %+v, want renewed under epoch 1", l)
		}
		// A JudgeAt later than the statement's time changes nothing.
		h.ExpireBucketLease(t, b.s, 1)
		leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
			Owner: "b", Node: nodeOf("b"), Buckets: bucket.Of(1), TTL: leaseTTL, JudgeAt: now.Add(time.Hour),
		})
		if err != nil {
			t.Fatal(err)
		}
		if l := leases[0]; !l.Held || !l.Acquired || l.Epoch != 2 {
			t.Errorf("b judging an hour later than the database: %+v, want the expired lease taken at epoch 2", l)
		}
	})

	t.Run("ReleaseOnlyByItsOwner", func(t *testing.T) {
		b := setup(t, h)
		acquire(b, "a", 1, 2, 3)
		released, err := b.s.ReleaseBuckets(b.ctx, "b", bucket.Set{})
		if err != nil || len(released) != 0 {
			t.Fatalf("release by a non-owner released %v (%v)", released, err)
		}
		released, err = b.s.ReleaseBuckets(b.ctx, "a", bucket.Of(1))
		if err != nil || len(released) != 1 || released[0] != 1 {
			t.Fatalf("release of bucket 1: %v, %v", released, err)
		}
		released, err = b.s.ReleaseBuckets(b.ctx, "a", bucket.Set{})
		if err != nil || len(released) != 2 {
			t.Fatalf("release of all a's buckets: %v, %v; want 2 and 3", released, err)
		}
		list, _ := b.s.ListBuckets(b.ctx)
		for _, bn := range []int{1, 2, 3} {
			if list[bn].Holder != "" {
				t.Errorf("bucket %d still held by %q after release", bn, list[bn].Holder)
			}
		}
		// A released lease is taken at once, with a new epoch.
		if l := acquire(b, "b", 1)[1]; !l.Acquired || l.Epoch != 2 {
			t.Errorf("after release: %+v, want b at epoch 2", l)
		}
	})

	t.Run("AStaleOwnerCannotReleaseItsSuccessors", func(t *testing.T) {
		b := setup(t, h)
		acquire(b, "a", 1)
		h.ExpireBucketLease(t, b.s, 1)
		acquire(b, "b", 1)
		released, err := b.s.ReleaseBuckets(b.ctx, "a", bucket.Of(1))
		if err != nil || len(released) != 0 {
			t.Fatalf("stale owner released %v (%v)", released, err)
		}
		list, _ := b.s.ListBuckets(b.ctx)
		if list[1].Holder != "b" || list[1].Epoch != 2 {
			t.Errorf("successor's lease after the stale release: %+v", list[1])
		}
	})
}
