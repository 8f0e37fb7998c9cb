package storetest

import (
	"errors"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testHandoffs holds what a live hand-off adds to the bucket leases: a
// holder marks its successor, then hands the lease over under the next
// epoch, and nobody else may take it meanwhile.
func testHandoffs(t *testing.T, h Harness) {
	lease := func(b *testBundle, bn int) store.BucketLease {
		b.t.Helper()
		list, err := b.s.ListBuckets(b.ctx)
		if err != nil {
			b.t.Fatalf("ListBuckets: %v", err)
		}
		return list[bn]
	}
	to := func(bn int, epoch int64, successor string) store.Handoff {
		return store.Handoff{Bucket: bn, Epoch: epoch, To: successor, ToNode: nodeOf(successor)}
	}
	handOff := func(b *testBundle, owner string, moves ...store.Handoff) []store.BucketLease {
		b.t.Helper()
		handed, err := b.s.HandOff(b.ctx, owner, moves, leaseTTL)
		if err != nil {
			b.t.Fatalf("HandOff: %v", err)
		}
		return handed
	}
	acquireOne := func(b *testBundle, owner string, bn int, take *bucket.Set) store.BucketLease {
		b.t.Helper()
		got, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
			Owner: owner, Node: nodeOf(owner), Buckets: bucket.Of(bn), TTL: leaseTTL, Take: take,
		})
		if err != nil || len(got) != 1 {
			b.t.Fatalf("AcquireBuckets(%s, %d): %v, %v", owner, bn, got, err)
		}
		return got[0]
	}

	t.Run("AReleaseNamingTheSuccessorGivesItTheNextEpoch", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1, 2)
		marked, err := b.s.MarkHandoff(b.ctx, "a", []store.Handoff{to(1, held[0].Epoch, "b")})
		if err != nil || len(marked) != 1 || marked[0] != 1 {
			t.Fatalf("MarkHandoff: %v, %v; want bucket 1 marked", marked, err)
		}
		if l := lease(b, 1); l.Holder != "a" || l.Successor != "node-b" || l.SuccessorOwner != "b" ||
			l.HandoffSince.IsZero() || l.HandedBy != "" {
			t.Errorf("a bucket marked for b is listed as %+v, want held by a, successor node-b", l)
		}
		if l := lease(b, 2); l.Successor != "" {
			t.Errorf("an unmarked bucket has successor %q", l.Successor)
		}
		handed := handOff(b, "a", to(1, held[0].Epoch, "b"))
		if len(handed) != 1 || handed[0].Bucket != 1 || handed[0].Holder != "b" || handed[0].Node != "node-b" ||
			handed[0].Epoch != held[0].Epoch+1 || handed[0].HandedBy != "node-a" {
			t.Fatalf("HandOff answered %+v, want bucket 1 held by b at epoch %d, handed by node-a", handed,
				held[0].Epoch+1)
		}
		if l := lease(b, 1); l.Holder != "b" || l.Epoch != held[0].Epoch+1 || l.Successor != "" ||
			l.HandedBy != "node-a" {
			t.Errorf("after the hand-off bucket 1 is listed as %+v, want held by b, handed by node-a, no successor", l)
		}
		// The successor takes it up at its next acquisition, with no wait
		// and the epoch of the hand-off.
		if l := acquireOne(b, "b", 1, &bucket.Set{}); !l.Held || !l.Acquired || l.Epoch != held[0].Epoch+1 {
			t.Errorf("the successor's acquisition: %+v, want held and acquired at epoch %d", l, held[0].Epoch+1)
		}
		if l := lease(b, 1); l.HandedBy != "" {
			t.Errorf("a hand-off taken up still shows handed by %q", l.HandedBy)
		}
		if l := acquireOne(b, "b", 1, nil); !l.Held || l.Acquired || l.Epoch != held[0].Epoch+1 {
			t.Errorf("the successor's next renewal: %+v, want held, not acquired, same epoch", l)
		}
		if l := lease(b, 2); l.Holder != "a" || l.Epoch != held[1].Epoch {
			t.Errorf("bucket 2, not handed off, is %+v", l)
		}
	})

	t.Run("NobodyElseTakesAHandedBucket", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1)
		handOff(b, "a", to(1, held[0].Epoch, "b"))
		all := bucket.Of(1)
		if l := acquireOne(b, "c", 1, &all); l.Held || l.Holder != "b" {
			t.Errorf("a third node asking for a bucket handed to b: %+v, want not held, holder b", l)
		}
		if l := acquireOne(b, "a", 1, nil); l.Held || l.Holder != "b" {
			t.Errorf("the giver asking again: %+v, want not held, holder b", l)
		}
	})

	t.Run("AStaleHolderIsFencedAfterAHandOff", func(t *testing.T) {
		b := setup(t, h)
		running, held := b.runningTask("a", 1)
		handOff(b, "a", to(1, held[0].Epoch, "b"))
		if out := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Succeeded}); !errors.Is(out.Err, store.ErrFenced) {
			t.Errorf("the giver's completion after the hand-off: %+v, want store.ErrFenced", out)
		}
		b.create(store.NewTask{Key: "k2", Bucket: 1})
		if got := b.claim("a", held, 10); len(got) != 0 {
			t.Errorf("the giver claimed %v under its old epoch after the hand-off", ids(got))
		}
		renewal, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{running.Ref()}, leaseTTL)
		if err != nil || len(renewal.Renewed) != 0 {
			t.Errorf("the giver renewed %v (%v) after the hand-off", renewal.Renewed, err)
		}
		if again, err := b.s.HandOff(b.ctx, "a", []store.Handoff{to(1, held[0].Epoch, "c")}, leaseTTL); err != nil || len(again) != 0 {
			t.Errorf("the giver handed the bucket off again: %v, %v", again, err)
		}
		if marked, err := b.s.MarkHandoff(b.ctx, "a", []store.Handoff{to(1, held[0].Epoch, "c")}); err != nil || len(marked) != 0 {
			t.Errorf("the giver marked the bucket again: %v, %v", marked, err)
		}
		if released, err := b.s.ReleaseBuckets(b.ctx, "a", bucket.Of(1)); err != nil || len(released) != 0 {
			t.Errorf("the giver released %v (%v) after the hand-off", released, err)
		}
		// The successor rescues what the giver ran under the old epoch at
		// once, as after any change of holder.
		got := acquireOne(b, "b", 1, nil)
		expired, err := b.s.ExpiredTasks(b.ctx, []store.HeldBucket{{Bucket: 1, Epoch: got.Epoch}}, 10)
		if err != nil || len(expired) != 1 || expired[0].ID != running.ID {
			t.Errorf("the successor's expired tasks: %v, %v; want task %d, claimed under the old epoch",
				ids(expired), err, running.ID)
		}
	})

	t.Run("OnlyTheHolderUnderItsEpochHandsOff", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1)
		for _, c := range []struct {
			owner string
			epoch int64
		}{{"c", held[0].Epoch}, {"a", held[0].Epoch + 1}, {"a", held[0].Epoch - 1}} {
			if got := handOff(b, c.owner, to(1, c.epoch, "b")); len(got) != 0 {
				t.Errorf("%s handing off under epoch %d moved %+v", c.owner, c.epoch, got)
			}
		}
		h.ExpireBucketLease(t, b.s, 1)
		if got := handOff(b, "a", to(1, held[0].Epoch, "b")); len(got) != 0 {
			t.Errorf("a holder whose lease expired handed it off: %+v", got)
		}
	})

	t.Run("AHandOffNobodyTakesUpLapsesLikeALease", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1)
		handOff(b, "a", to(1, held[0].Epoch, "b"))
		h.ExpireBucketLease(t, b.s, 1)
		if l := acquireOne(b, "c", 1, nil); !l.Held || !l.Acquired || l.Epoch != held[0].Epoch+2 {
			t.Errorf("after the handed lease lapsed: %+v, want c at epoch %d", l, held[0].Epoch+2)
		}
		if l := lease(b, 1); l.HandedBy != "" || l.Successor != "" {
			t.Errorf("a lapsed hand-off is still listed: %+v", l)
		}
	})

	t.Run("AMarkIsCalledOffOrLeftBehindByAChangeOfHolder", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1, 2)
		if _, err := b.s.MarkHandoff(b.ctx, "a", []store.Handoff{to(1, held[0].Epoch, "b"), to(2, held[1].Epoch, "b")}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.s.MarkHandoff(b.ctx, "a", []store.Handoff{{Bucket: 1, Epoch: held[0].Epoch}}); err != nil {
			t.Fatal(err)
		}
		if l := lease(b, 1); l.Successor != "" || !l.HandoffSince.IsZero() {
			t.Errorf("a hand-off called off is listed as %+v", l)
		}
		if l := acquireOne(b, "a", 2, nil); !l.Held || l.Acquired {
			t.Fatalf("renewal of a marked bucket: %+v", l)
		}
		if l := lease(b, 2); l.Successor != "node-b" {
			t.Errorf("a renewal dropped the mark: %+v", l)
		}
		h.ExpireBucketLease(t, b.s, 2)
		if l := lease(b, 2); l.Successor != "" {
			t.Errorf("the mark of an expired lease is listed: %+v", l)
		}
		acquireOne(b, "c", 2, nil)
		if l := lease(b, 2); l.Holder != "c" || l.Successor != "" {
			t.Errorf("the mark outlived a change of holder: %+v", l)
		}
		if _, err := b.s.MarkHandoff(b.ctx, "a", []store.Handoff{to(1, held[0].Epoch, "b")}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.s.ReleaseBuckets(b.ctx, "a", bucket.Of(1)); err != nil {
			t.Fatal(err)
		}
		acquireOne(b, "a", 1, nil)
		if l := lease(b, 1); l.Successor != "" {
			t.Errorf("the mark outlived a release: %+v", l)
		}
	})

	t.Run("TakeLimitsWhatIsTakenNotWhatIsRenewed", func(t *testing.T) {
		b := setup(t, h)
		b.hold("a", 1)
		take := bucket.Of(2)
		got, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
			Owner: "a", Node: nodeOf("a"), Buckets: bucket.Of(1, 2, 3), TTL: leaseTTL, Take: &take,
		})
		if err != nil || len(got) != 3 {
			t.Fatalf("AcquireBuckets with Take: %v, %v", got, err)
		}
		if !got[0].Held || got[0].Acquired {
			t.Errorf("its own lease of bucket 1, not in Take: %+v, want renewed", got[0])
		}
		if !got[1].Held || !got[1].Acquired {
			t.Errorf("free bucket 2, in Take: %+v, want taken", got[1])
		}
		if got[2].Held || got[2].Holder != "" {
			t.Errorf("free bucket 3, not in Take: %+v, want left free", got[2])
		}
		if l := lease(b, 3); l.Holder != "" {
			t.Errorf("bucket 3 is held by %q", l.Holder)
		}
	})

	t.Run("PinsStayUntilRemoved", func(t *testing.T) {
		b := setup(t, h)
		if err := b.s.PinBuckets(b.ctx, bucket.Of(1, 2), "node-b"); err != nil {
			t.Fatal(err)
		}
		held := b.hold("a", 1)
		handOff(b, "a", to(1, held[0].Epoch, "b"))
		h.ExpireBucketLease(t, b.s, 1)
		b.hold("c", 1)
		if _, err := b.s.ReleaseBuckets(b.ctx, "c", bucket.Set{}); err != nil {
			t.Fatal(err)
		}
		for _, bn := range []int{1, 2} {
			if l := lease(b, bn); l.Pin != "node-b" {
				t.Errorf("bucket %d pinned to node-b is listed with pin %q", bn, l.Pin)
			}
		}
		if err := b.s.PinBuckets(b.ctx, bucket.Of(1), ""); err != nil {
			t.Fatal(err)
		}
		if l := lease(b, 1); l.Pin != "" {
			t.Errorf("an unpinned bucket is listed with pin %q", l.Pin)
		}
		if err := b.s.PinBuckets(b.ctx, bucket.Of(numBuckets), "node-b"); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("pinning a bucket the fleet does not have: %v, want store.ErrInvalid", err)
		}
	})

	t.Run("ABatchNoStoreCouldApplyIsRefused", func(t *testing.T) {
		b := setup(t, h)
		held := b.hold("a", 1)
		for name, moves := range map[string][]store.Handoff{
			"no successor":     {{Bucket: 1, Epoch: held[0].Epoch}},
			"a bucket twice":   {to(1, held[0].Epoch, "b"), to(1, held[0].Epoch, "c")},
			"a foreign bucket": {to(numBuckets, 1, "b")},
		} {
			if _, err := b.s.HandOff(b.ctx, "a", moves, leaseTTL); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("a hand-off with %s: %v, want store.ErrInvalid", name, err)
			}
		}
		if l := lease(b, 1); l.Holder != "a" || l.Epoch != held[0].Epoch {
			t.Errorf("a refused batch changed bucket 1: %+v", l)
		}
	})
}
