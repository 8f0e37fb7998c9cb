package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func (b *testBundle) claimLimited(owner string, held []store.HeldBucket, limit int, lc store.LimitedClaim, kinds ...string) []*task.Task {
	b.t.Helper()
	if len(kinds) == 0 {
		kinds = []string{"noop"}
	}
	got, err := b.s.ClaimLimited(b.ctx, store.ClaimRequest{
		Owner: owner, Node: nodeOf(owner), Buckets: held, Kinds: kinds, Limit: limit, LeaseTTL: leaseTTL,
	}, lc)
	if err != nil {
		b.t.Fatalf("ClaimLimited: %v", err)
	}
	return got
}

// countByKey counts claimed tasks by their effective limit key.
func countByKey(ts []*task.Task) map[string]int {
	out := map[string]int{}
	for _, t := range ts {
		out[store.LimitKeyOf(t.Key, t.LimitKey)]++
	}
	return out
}

func testLimits(t *testing.T, h Harness) {
	t.Run("SetListReplaceDelete", func(t *testing.T) {
		b := setup(t, h)
		api, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		if api.CreatedAt.IsZero() || api.Concurrency != 2 {
			t.Errorf("saved %+v", api)
		}
		if _, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "mail", Kind: "send", Per: store.PerKey, Rate: 10,
			Period: time.Second, Burst: 5}); err != nil {
			t.Fatal(err)
		}
		// A replacement changes the rule, keeps the creation time.
		again, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "api", Kind: "fetch", Per: store.PerFleet, Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		if !again.CreatedAt.Equal(api.CreatedAt) || again.Per != store.PerFleet || again.Concurrency != 4 {
			t.Errorf("replaced %+v, first %+v", again, api)
		}
		all, err := b.s.ListLimits(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 2 || all[0].Name != "api" || all[1].Name != "mail" || all[1].Rate != 10 ||
			all[1].Period != time.Second || all[1].Burst != 5 {
			t.Errorf("listed %+v", all)
		}
		if err := b.s.DeleteLimit(b.ctx, "api"); err != nil {
			t.Fatal(err)
		}
		if err := b.s.DeleteLimit(b.ctx, "api"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleting twice: %v, want ErrNotFound", err)
		}
	})

	t.Run("RefusesBadLimits", func(t *testing.T) {
		b := setup(t, h)
		for _, l := range []store.Limit{
			{Name: "", Kind: "k", Per: store.PerKey, Concurrency: 1},
			{Name: "x", Kind: "k", Per: "tenant", Concurrency: 1},
			{Name: "x", Kind: "k", Per: store.PerKey},
			{Name: "x", Kind: "k", Per: store.PerKey, Concurrency: 1, Rate: 1, Period: time.Second},
			{Name: "x", Kind: "k", Per: store.PerFleet, Rate: 1, Period: time.Second},
			{Name: "x", Kind: "k", Per: store.PerKey, Rate: 1},
			{Name: "x", Kind: "k", Per: store.PerKey, Concurrency: -1},
		} {
			var inv *store.InvalidError
			if _, err := b.s.UpsertLimit(b.ctx, l); !errors.As(err, &inv) || !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%+v: %v, want an *InvalidError", l, err)
			}
		}
		if all, _ := b.s.ListLimits(b.ctx); len(all) != 0 {
			t.Errorf("a refused limit was saved: %+v", all)
		}
	})

	t.Run("TasksKeepLimitKeyAndResources", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "order-1", LimitKey: "tenant-7", Bucket: 2,
			Resources: store.Resources{"gpu": 1, "mem": 8}})[0]
		if created.LimitKey != "tenant-7" || created.Resources["gpu"] != 1 {
			t.Errorf("created %+v", created)
		}
		got := b.get(created.ID)
		if got.LimitKey != "tenant-7" || len(got.Resources) != 2 || got.Resources["mem"] != 8 {
			t.Errorf("read back limit key %q, resources %v", got.LimitKey, got.Resources)
		}
		// The bulk path keeps them too.
		many := make([]store.NewTask, 150)
		for i := range many {
			many[i] = store.NewTask{Kind: "noop", Key: "k", LimitKey: fmt.Sprintf("t%d", i%3), Bucket: 1,
				Resources: store.Resources{"gpu": int64(1 + i%2)}}
		}
		out := b.create(many...)
		if g := b.get(out[149].ID); g.LimitKey != "t2" || g.Resources["gpu"] != 2 {
			t.Errorf("bulk task read back with %q %v", g.LimitKey, g.Resources)
		}
		listed, err := b.s.ListTasks(b.ctx, store.TaskFilter{Limit: 1})
		if err != nil || len(listed) != 1 || listed[0].LimitKey != "t2" {
			t.Errorf("listed %v %v", listed, err)
		}
	})

	t.Run("ClaimKeepsToEachKeysRoom", func(t *testing.T) {
		b := setup(t, h)
		var nts []store.NewTask
		for i := range 4 {
			nts = append(nts, store.NewTask{Key: fmt.Sprintf("a%d", i), LimitKey: "a", Bucket: 1})
		}
		for i := range 3 {
			nts = append(nts, store.NewTask{Key: "b", Bucket: 1, Priority: -i})
		}
		nts = append(nts, store.NewTask{Key: "c", Bucket: 1})
		b.create(nts...)
		held := b.hold("a", 1)
		got := b.claimLimited("a", held, 10, store.LimitedClaim{
			Kinds: []store.KindRoom{{Kind: "noop", Room: -1, KeyRoom: 2}},
			Keys:  []store.KeyRoom{{Kind: "noop", Key: "a", Room: 1, Used: 1}, {Kind: "noop", Key: "c", Room: 0}},
		})
		if n := countByKey(got); n["a"] != 1 || n["b"] != 2 || n["c"] != 0 || len(got) != 3 {
			t.Errorf("claimed by key %v, want a:1 b:2 (the default key room) c:0 (closed)", n)
		}
		for _, c := range got {
			if c.Status != task.Running || c.Owner != "a" {
				t.Errorf("claimed %+v", c)
			}
		}
		// A claim of the same rooms again takes what is left of them.
		again := b.claimLimited("a", held, 10, store.LimitedClaim{
			Keys: []store.KeyRoom{{Kind: "noop", Key: "a", Room: 0}, {Kind: "noop", Key: "c", Room: 0}},
		})
		if n := countByKey(again); n["b"] != 1 || len(again) != 1 {
			t.Errorf("second claim by key %v, want b:1", n)
		}
	})

	t.Run("ClaimKeepsToTheKindsRoom", func(t *testing.T) {
		b := setup(t, h)
		for i := range 5 {
			b.create(store.NewTask{Kind: "train", Key: fmt.Sprint(i), Bucket: 2}, store.NewTask{Key: fmt.Sprint(i), Bucket: 2})
		}
		held := b.hold("a", 2)
		got := b.claimLimited("a", held, 100, store.LimitedClaim{
			Kinds: []store.KindRoom{{Kind: "train", Room: 2, KeyRoom: -1}},
		}, "train", "noop")
		kinds := map[string]int{}
		for _, c := range got {
			kinds[c.Kind]++
		}
		if kinds["train"] != 2 || kinds["noop"] != 5 {
			t.Errorf("claimed %v, want train:2 noop:5", kinds)
		}
		if got := b.claimLimited("a", held, 100, store.LimitedClaim{
			Kinds: []store.KindRoom{{Kind: "train", Room: 0, KeyRoom: -1}},
		}, "train"); len(got) != 0 {
			t.Errorf("a closed kind gave %v", ids(got))
		}
	})

	t.Run("ClaimKeepsToFreeResources", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "g1", Bucket: 3, Resources: store.Resources{"gpu": 1}},
			store.NewTask{Key: "g2", Bucket: 3, Resources: store.Resources{"gpu": 1}},
			store.NewTask{Key: "t", Bucket: 3, Resources: store.Resources{"tpu": 1}},
			store.NewTask{Key: "plain", Bucket: 3},
		)
		held := b.hold("a", 3)
		got := b.claimLimited("a", held, 10, store.LimitedClaim{Free: store.Resources{"gpu": 1, "mem": 4}})
		if !slices.Equal(ids(got), []int64{created[0].ID, created[3].ID}) {
			t.Errorf("claimed %v, want the first gpu task and the plain one (gpu=1 free, no tpu)", ids(got))
		}
		if got := b.claimLimited("a", held, 10, store.LimitedClaim{Free: store.Resources{"gpu": 0}}); len(got) != 0 {
			t.Errorf("no gpu free, claimed %v", ids(got))
		}
	})
	// The round robin holds for tasks that need resources: a key that has
	// started in the round waits for another key's first task, though its
	// older tasks come first in claim order and need the one gpu too.
	t.Run("ClaimRoundRobinHoldsForTasksThatNeedResources", func(t *testing.T) {
		b := setup(t, h)
		gpu := store.Resources{"gpu": 1}
		for i := range 40 {
			b.create(store.NewTask{Key: fmt.Sprintf("hot-%d", i), LimitKey: "hot", Bucket: 3, Resources: gpu})
		}
		cold := b.create(store.NewTask{Key: "cold", Bucket: 3, Resources: gpu})[0]
		held := b.hold("a", 3)
		got := b.claimLimited("a", held, 1, store.LimitedClaim{
			Keys: []store.KeyRoom{{Kind: "noop", Key: "hot", Room: -1, Turn: 1}},
			Free: gpu, Capacity: gpu,
		})
		if !slices.Equal(ids(got), []int64{cold.ID}) {
			t.Errorf("with one gpu free and key hot a round ahead, claimed %v; want cold's task %d", ids(got), cold.ID)
		}
	})
	// A task first in line that needs more than the node has in all never
	// starts there and holds back none after it; one that could start
	// once enough is free keeps its place.
	t.Run("ClaimPassesOverATaskBeyondTheCapacity", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "big", Bucket: 3, Resources: store.Resources{"gpu": 2}},
			store.NewTask{Key: "small", Bucket: 3, Resources: store.Resources{"gpu": 1}},
		)
		held := b.hold("a", 3)
		if got := b.claimLimited("a", held, 10, store.LimitedClaim{Free: store.Resources{"gpu": 1},
			Capacity: store.Resources{"gpu": 2}}); len(got) != 0 {
			t.Errorf("with gpu=2 in all and 1 free, claimed %v; want nothing: the first waits for both", ids(got))
		}
		got := b.claimLimited("a", held, 10, store.LimitedClaim{Free: store.Resources{"gpu": 1},
			Capacity: store.Resources{"gpu": 1}})
		if !slices.Equal(ids(got), []int64{created[1].ID}) {
			t.Errorf("with gpu=1 in all, claimed %v; want the small one, past the one that never fits", ids(got))
		}
	})
	// Nor does it take a place in its key's room.
	t.Run("ATaskBeyondTheCapacityTakesNoPlaceInItsKeysRoom", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "big", LimitKey: "tenant", Bucket: 3, Resources: store.Resources{"gpu": 2}},
			store.NewTask{Key: "plain", LimitKey: "tenant", Bucket: 3},
		)
		held := b.hold("a", 3)
		got := b.claimLimited("a", held, 10, store.LimitedClaim{
			Kinds:    []store.KindRoom{{Kind: "noop", Room: -1, KeyRoom: 1}},
			Free:     store.Resources{"gpu": 1},
			Capacity: store.Resources{"gpu": 1},
		})
		if !slices.Equal(ids(got), []int64{created[1].ID}) {
			t.Errorf("one per key, the key's first task beyond the capacity: claimed %v; want the key's second", ids(got))
		}
	})

	// A node that declares no capacity uses the plain claim: a task that
	// needs resources waits for a node whose capacity covers it.
	t.Run("PlainClaimLeavesTasksThatNeedResources", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "g", Bucket: 3, Resources: store.Resources{"gpu": 1}},
			store.NewTask{Key: "plain", Bucket: 3},
		)
		held := b.hold("a", 3)
		if got := b.claim("a", held, 10); !slices.Equal(ids(got), []int64{created[1].ID}) {
			t.Errorf("the plain claim took %v, want only the task that needs nothing", ids(got))
		}
		if got := b.claimLimited("a", held, 10, store.LimitedClaim{Free: store.Resources{"gpu": 1}}); !slices.Equal(ids(got), []int64{created[0].ID}) {
			t.Errorf("a claim with a gpu free took %v, want the gpu task", ids(got))
		}
	})

	t.Run("ClaimServesTheLeastUsedKeysFirst", func(t *testing.T) {
		b := setup(t, h)
		var nts []store.NewTask
		for range 6 {
			nts = append(nts, store.NewTask{Key: "big", Bucket: 4})
		}
		nts = append(nts, store.NewTask{Key: "small1", Bucket: 4}, store.NewTask{Key: "small2", Bucket: 4})
		b.create(nts...)
		held := b.hold("a", 4)
		got := b.claimLimited("a", held, 2, store.LimitedClaim{
			Keys: []store.KeyRoom{{Kind: "noop", Key: "big", Room: -1, Used: 5}},
		})
		if n := countByKey(got); n["small1"] != 1 || n["small2"] != 1 {
			t.Errorf("claimed %v: the keys with nothing running come before the key with 5", n)
		}
	})

	t.Run("ClaimIsFencedLikeClaimTasks", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 5})
		held := b.hold("a", 5)
		if got := b.claimLimited("b", held, 10, store.LimitedClaim{}); len(got) != 0 {
			t.Errorf("another owner claimed %v", ids(got))
		}
		wrong := []store.HeldBucket{{Bucket: 5, Epoch: held[0].Epoch + 1}}
		if got := b.claimLimited("a", wrong, 10, store.LimitedClaim{}); len(got) != 0 {
			t.Errorf("a claim under a wrong epoch returned %v", ids(got))
		}
		h.ExpireBucketLease(t, b.s, 5)
		if got := b.claimLimited("a", held, 10, store.LimitedClaim{}); len(got) != 0 {
			t.Errorf("an expired lease claimed %v", ids(got))
		}
	})

	t.Run("OutcomesAndClaimInOneCall", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "first", LimitKey: "a", Bucket: 3}, store.NewTask{Key: "fails", Bucket: 3})
		held := b.hold("a", 3)
		running := b.claimLimited("a", held, 2, store.LimitedClaim{})
		if len(running) != 2 {
			t.Fatalf("claimed %d, want 2", len(running))
		}
		b.create(store.NewTask{Key: "next", LimitKey: "a", Bucket: 3})
		var first, fails *task.Task
		for _, r := range running {
			if r.Key == "first" {
				first = r
			} else {
				fails = r
			}
		}
		req := store.ClaimRequest{Owner: "a", Node: nodeOf("a"), Buckets: held, Kinds: []string{"noop"}, Limit: 10,
			LeaseTTL: leaseTTL}
		// Key a has room for one: the one its ending task frees. The
		// failed task, due again at once, is claimed again by the same call.
		lc := store.LimitedClaim{Keys: []store.KeyRoom{{Kind: "noop", Key: "a", Room: 1, Used: 1}}}
		batch := []store.ActiveTransition{
			{Ref: first.Ref(), To: task.Succeeded, Node: nodeOf("a")},
			{Ref: fails.Ref(), To: task.Retrying, Error: "boom", Node: nodeOf("a")},
			{Ref: task.Ref{ID: first.ID, ClaimSeq: first.ClaimSeq - 1}, To: task.Succeeded, Node: nodeOf("a")},
		}
		if _, _, err := b.s.AdvanceAndClaimLimited(b.ctx, "a", batch, req, lc); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("a batch naming a task twice: %v, want ErrInvalid", err)
		}
		if got := b.get(first.ID); got.Status != task.Running {
			t.Fatalf("a refused batch wrote %s", got.Status)
		}
		out, claimed, err := b.s.AdvanceAndClaimLimited(b.ctx, "a", batch[:2], req, lc)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 2 || out[0].Err != nil || out[0].Status != task.Succeeded || out[1].Err != nil || out[1].Status != task.Retrying {
			t.Fatalf("outcomes %+v, want succeeded and retrying", out)
		}
		keys := map[string]int64{}
		for _, c := range claimed {
			keys[c.Key] = c.ClaimSeq
			if c.Status != task.Running || c.Owner != "a" {
				t.Errorf("claimed %+v", c)
			}
		}
		if _, ok := keys["next"]; !ok || keys["fails"] != fails.ClaimSeq+1 || len(claimed) != 2 {
			t.Errorf("claimed %v (key: claim seq), want next and fails's second attempt", keys)
		}
		// A stale attempt's outcome is fenced, and the claim still runs.
		b.create(store.NewTask{Key: "last", Bucket: 3})
		out, claimed, err = b.s.AdvanceAndClaimLimited(b.ctx, "a",
			[]store.ActiveTransition{{Ref: fails.Ref(), To: task.Succeeded, Node: nodeOf("a")}}, req, store.LimitedClaim{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || !errors.Is(out[0].Err, store.ErrFenced) {
			t.Errorf("a superseded attempt's outcome: %+v, want fenced", out)
		}
		if len(claimed) != 1 || claimed[0].Key != "last" {
			t.Errorf("claimed %v, want last", ids(claimed))
		}
	})

	t.Run("ActiveUseListsEveryActiveTaskOfTheBuckets", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "x", LimitKey: "tenant", Bucket: 1, Resources: store.Resources{"gpu": 2}},
			store.NewTask{Key: "y", Bucket: 2}, store.NewTask{Key: "z", Bucket: 1})
		heldA := b.hold("a", 1)
		b.claimLimited("a", heldA, 1, store.LimitedClaim{Free: store.Resources{"gpu": 2}})
		heldB := b.hold("b", 2)
		b.claim("b", heldB, 10)
		use, err := b.s.ActiveUse(b.ctx, []int{1, 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(use) != 2 || use[0].LimitKey != "tenant" || use[0].Resources["gpu"] != 2 || use[0].Owner != "a" ||
			use[0].Epoch != heldA[0].Epoch || use[0].ClaimSeq != 1 || use[1].LimitKey != "y" || use[1].Owner != "b" ||
			use[1].ClaimSeq != 1 {
			t.Errorf("active use %+v", use)
		}
		if use, _ := b.s.ActiveUse(b.ctx, []int{3}); len(use) != 0 {
			t.Errorf("bucket 3 has %+v", use)
		}
	})

	t.Run("SharesLeaveNoHolderWithNothing", func(t *testing.T) {
		b := setup(t, h)
		if _, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4}); err != nil {
			t.Fatal(err)
		}
		owners := []string{"a", "b", "c"}
		for i, owner := range owners {
			for k := range 5 {
				b.create(store.NewTask{Kind: "train", Key: fmt.Sprintf("%s-%d", owner, k), Bucket: i + 1})
			}
			b.hold(owner, i+1)
		}
		// Four over three holders who each want four: one of them gets
		// the one left over, the same one whoever asks, so that after a
		// round of renewals none is left with nothing.
		shares := map[string]int{}
		for range 3 {
			for i, owner := range owners {
				sh, err := b.s.TakeShare(b.ctx, store.ShareRequest{Limit: "train", Owner: owner, Node: nodeOf(owner),
					MaxDemand: 100, Buckets: []int{i + 1}, TTL: leaseTTL})
				if err != nil {
					t.Fatal(err)
				}
				shares[owner] = sh.Share
			}
		}
		if shares["a"]+shares["b"]+shares["c"] != 4 || min(shares["a"], shares["b"], shares["c"]) != 1 {
			t.Errorf("shares of 4 over three holders wanting 4 each: %v, want 2, 1 and 1", shares)
		}
	})
	t.Run("ShareDemandCountsOnlyTasksTheHolderCouldStart", func(t *testing.T) {
		b := setup(t, h)
		if _, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 1}); err != nil {
			t.Fatal(err)
		}
		// a holds a task needing 2 gpus and has 1: it can never start
		// it, and wants nothing; b's task needs nothing.
		b.create(store.NewTask{Kind: "train", Key: "big", Bucket: 1, Resources: store.Resources{"gpu": 2}})
		b.create(store.NewTask{Kind: "train", Key: "small", Bucket: 2})
		b.hold("a", 1)
		b.hold("b", 2)
		take := func(owner string, bucket int, capacity store.Resources) store.Share {
			t.Helper()
			sh, err := b.s.TakeShare(b.ctx, store.ShareRequest{Limit: "train", Owner: owner, Node: nodeOf(owner),
				MaxDemand: 100, Buckets: []int{bucket}, Capacity: capacity, TTL: leaseTTL})
			if err != nil {
				t.Fatal(err)
			}
			return sh
		}
		if sh := take("a", 1, store.Resources{"gpu": 1}); sh.Demand != 0 || sh.Share != 0 {
			t.Fatalf("a holder with 1 gpu whose only task needs 2: demand %d, share %d; want 0 and 0", sh.Demand, sh.Share)
		}
		if sh := take("b", 2, nil); sh.Demand != 1 || sh.Share != 1 {
			t.Fatalf("the holder of the runnable task: demand %d, share %d; want 1 and 1", sh.Demand, sh.Share)
		}
		if sh := take("a", 1, nil); sh.Demand != 0 {
			t.Errorf("a holder with no capacity counts a task needing a gpu: demand %d, want 0", sh.Demand)
		}
		if sh := take("a", 1, store.Resources{"gpu": 2, "mem": 1}); sh.Demand != 1 {
			t.Errorf("a holder with 2 gpus: demand %d for a task needing 2, want 1", sh.Demand)
		}
	})

	t.Run("SharesNeverSumPastTheLimit", func(t *testing.T) {
		b := setup(t, h)
		if _, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4}); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			b.create(store.NewTask{Kind: "train", Key: fmt.Sprint(i), Bucket: 1}, store.NewTask{Kind: "train", Key: fmt.Sprint(i), Bucket: 2})
		}
		b.hold("a", 1)
		b.hold("b", 2)
		ttl := leaseTTL
		take := func(owner string, running int, buckets ...int) store.Share {
			t.Helper()
			sh, err := b.s.TakeShare(b.ctx, store.ShareRequest{Limit: "train", Owner: owner, Node: nodeOf(owner),
				Running: running, MaxDemand: 100, Buckets: buckets, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			return sh
		}
		a := take("a", 0, 1)
		if !a.Found || a.N != 4 || a.Share != 4 || a.Demand != 4 {
			t.Errorf("the first holder, alone: %+v, want all 4", a)
		}
		// b wants as much, but a holds it all until a gives some back.
		if bs := take("b", 0, 2); bs.Share != 0 || bs.Demand != 4 {
			t.Errorf("b beside a's 4: %+v, want 0", bs)
		}
		// a renews: with b's demand published, its fair share is 2.
		if a := take("a", 0, 1); a.Share != 2 {
			t.Errorf("a again beside b: %+v, want 2", a)
		}
		if bs := take("b", 0, 2); bs.Share != 2 {
			t.Errorf("b after a gave back: %+v, want 2", bs)
		}
		// a's share lapses while two of its tasks still run: they still
		// count, so a newcomer gets only what is left.
		heldA := []store.HeldBucket{{Bucket: 1, Epoch: b.hold("a", 1)[0].Epoch}}
		if got := b.claim("a", heldA, 2, "train"); len(got) != 2 {
			t.Fatalf("a claimed %v", ids(got))
		}
		ttl = time.Microsecond
		take("a", 2, 1)
		ttl = leaseTTL
		eventually(t, 10*time.Second, "a's share lapses", func() bool {
			shares, err := b.s.ListShares(b.ctx)
			return err == nil && len(shares) == 2 && shares[0].Owner == "a" && !shares[0].Alive
		})
		if sh := take("c", 0, 3); sh.Share != 0 {
			t.Errorf("c beside a's 2 and b's 2: %+v, want 0", sh)
		}
		if err := b.s.DeleteLimit(b.ctx, "train"); err != nil {
			t.Fatal(err)
		}
		// The shares go with the limit: none is listed, and none counts
		// against a limit of the same name declared again.
		if shares, err := b.s.ListShares(b.ctx); err != nil || len(shares) != 0 {
			t.Errorf("shares after the limit was deleted: %+v, %v", shares, err)
		}
		if sh := take("a", 2, 1); sh.Found {
			t.Errorf("a share of a deleted limit: %+v", sh)
		}
	})

	// A takeover moves a bucket, not the old holder's quota: the new holder
	// starts from zero and gets only what the old holder's live share and
	// its still-running rows leave, until both are gone.
	t.Run("ShareOfANewHolderWaitsForTheOldHoldersShare", func(t *testing.T) {
		b := setup(t, h)
		const n = 4
		if _, err := b.s.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: n}); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			b.create(store.NewTask{Kind: "train", Key: fmt.Sprint(i), Bucket: 1})
		}
		take := func(owner string, running int, ttl time.Duration, buckets ...int) store.Share {
			t.Helper()
			sh, err := b.s.TakeShare(b.ctx, store.ShareRequest{Limit: "train", Owner: owner, Node: nodeOf(owner),
				Running: running, MaxDemand: 100, Buckets: buckets, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			return sh
		}
		// held is what the fleet holds of the limit as the store sees it:
		// each holder at the larger of its live share and its running rows.
		held := func(step string) (total int, share, running map[string]int) {
			t.Helper()
			shares, err := b.s.ListShares(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			use, err := b.s.ListKeyUse(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			share, running = map[string]int{}, map[string]int{}
			for _, s := range shares {
				if s.Limit == "train" && s.Alive {
					share[s.Node] = s.Share
				}
			}
			for _, u := range use {
				if u.Kind == "train" {
					running[u.Node] += u.Active
				}
			}
			nodes := map[string]bool{}
			for node := range share {
				nodes[node] = true
			}
			for node := range running {
				nodes[node] = true
			}
			for node := range nodes {
				total += max(share[node], running[node])
			}
			if total > n {
				t.Errorf("%s: the fleet holds %d of %d (live shares %v, running %v)", step, total, n, share, running)
			}
			return total, share, running
		}

		heldA := b.hold("a", 1)
		if a := take("a", 0, leaseTTL, 1); !a.Found || a.Share != n || a.Demand != n {
			t.Fatalf("a alone: %+v, want all %d", a, n)
		}
		aTasks := b.claim("a", heldA, 3, "train")
		if len(aTasks) != 3 {
			t.Fatalf("a claimed %v, want 3", ids(aTasks))
		}
		if a := take("a", 3, leaseTTL, 1); a.Share != n {
			t.Fatalf("a renewing with 3 running: %+v, want %d", a, n)
		}
		held("a runs 3 under its share")

		// a is frozen past its lease; b takes the bucket under a new epoch.
		h.ExpireBucketLease(t, b.s, 1)
		heldB := b.hold("b", 1)
		if heldB[0].Epoch <= heldA[0].Epoch {
			t.Fatalf("b holds bucket 1 under epoch %d, a held it under %d", heldB[0].Epoch, heldA[0].Epoch)
		}
		bs := take("b", 0, leaseTTL, 1)
		if bs.Share != 0 || bs.Demand != 3 {
			t.Errorf("b beside a's live share of %d: %+v, want share 0, demand 3 (the queued tasks)", n, bs)
		}
		held("b took beside a's live share")

		// a renews at its next heartbeat, without the bucket: its share may
		// fall below the 3 it still runs, and then b counts a by its rows.
		a := take("a", 3, leaseTTL)
		if bs := take("b", 0, leaseTTL, 1); bs.Share != n-max(a.Share, 3) {
			t.Errorf("b beside a's live share %d and 3 running rows: %+v, want %d", a.Share, bs, n-max(a.Share, 3))
		}
		held("b took beside a's renewed share")

		// a's last renewal lapses at once: a starts nothing more, but its
		// three tasks still run.
		take("a", 3, time.Microsecond)
		held("a renewed for the last time")
		eventually(t, 10*time.Second, "a's share lapses", func() bool {
			shares, err := b.s.ListShares(b.ctx)
			if err != nil {
				return false
			}
			for _, s := range shares {
				if s.Owner == "a" {
					return !s.Alive
				}
			}
			return false
		})
		if bs := take("b", 0, leaseTTL, 1); bs.Share != n-3 {
			t.Errorf("b beside a's lapsed share and 3 running rows: %+v, want %d", bs, n-3)
		}
		if got := b.claim("b", heldB, 1, "train"); len(got) != 1 {
			t.Fatalf("b claimed %v under its share of 1", ids(got))
		}
		held("b runs 1 beside a's 3")

		// b rescues a's tasks (claimed under the older epoch), one first:
		// each row counts until it no longer runs.
		expired, err := b.s.ExpiredTasks(b.ctx, heldB, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(expired) != 3 {
			t.Fatalf("expired after the takeover: %v, want a's 3", ids(expired))
		}
		rescue := func(x *task.Task) {
			t.Helper()
			if _, err := b.s.Transition(b.ctx, store.Transition{ID: x.ID, Version: x.StatusVersion, To: task.Retrying,
				Reason: "lease of a expired", Node: nodeOf("b"), Epoch: heldB[0].Epoch,
				Guard: &store.LeaseGuard{Owner: "b", Epoch: heldB[0].Epoch}}); err != nil {
				t.Fatalf("rescue %d: %v", x.ID, err)
			}
		}
		rescue(expired[0])
		if bs := take("b", 1, leaseTTL, 1); bs.Share != n-2 {
			t.Errorf("b beside a's 2 running rows: %+v, want %d", bs, n-2)
		}
		held("one of a's tasks rescued")
		for _, x := range expired[1:] {
			rescue(x)
		}
		if bs := take("b", 1, leaseTTL, 1); bs.Share != n || bs.Demand != n {
			t.Errorf("b once a holds nothing: %+v, want all %d", bs, n)
		}
		if got := b.claim("b", heldB, n-1, "train"); len(got) != n-1 {
			t.Fatalf("b claimed %v, want %d more", ids(got), n-1)
		}
		if total, _, running := held("b runs its full share"); total != n || running[nodeOf("b")] != n {
			t.Errorf("the fleet holds %d, b runs %d; want b alone at %d", total, running[nodeOf("b")], n)
		}
	})

	t.Run("WaitReasonsAreWrittenOnceAndClearedByTheClaim", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "x", LimitKey: "tenant-7", Bucket: 6}, store.NewTask{Key: "tenant-7", Bucket: 6},
			store.NewTask{Key: "other", Bucket: 6})
		held := b.hold("a", 6)
		reasons := []store.WaitReason{{Kind: "noop", LimitKey: "tenant-7", Reason: "concurrency limit api: tenant-7 at 2/2"}}
		n, err := b.s.SetWaitReasons(b.ctx, "a", held, reasons)
		if err != nil || n != 2 {
			t.Fatalf("SetWaitReasons: %d rows, %v; want 2", n, err)
		}
		if n, _ := b.s.SetWaitReasons(b.ctx, "a", held, reasons); n != 0 {
			t.Errorf("the same reasons again wrote %d rows", n)
		}
		if n, _ := b.s.SetWaitReasons(b.ctx, "b", held, reasons); n != 0 {
			t.Errorf("a node that does not hold the bucket wrote %d rows", n)
		}
		if got := b.get(created[0].ID); got.WaitReason != reasons[0].Reason {
			t.Errorf("wait reason %q", got.WaitReason)
		}
		if got := b.get(created[2].ID); got.WaitReason != "" {
			t.Errorf("another key's task has reason %q", got.WaitReason)
		}
		events, _ := b.s.TaskEvents(b.ctx, created[0].ID)
		if len(events) != 1 {
			t.Errorf("a wait reason added events: %+v", events)
		}
		claimed := b.claimLimited("a", held, 10, store.LimitedClaim{})
		if len(claimed) != 3 || claimed[0].WaitReason != "" || b.get(created[0].ID).WaitReason != "" {
			t.Errorf("the claim left the reason: %+v", claimed)
		}
	})
	t.Run("WaitReasonsNameAWholeKindOrTheTasksThatDoNotFit", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "closed", Bucket: 6},
			store.NewTask{Key: "gpu-1", Bucket: 6, Resources: store.Resources{"gpu": 1}},
			store.NewTask{Key: "gpu-3", Bucket: 6, Resources: store.Resources{"gpu": 3}},
			store.NewTask{Key: "tpu", Bucket: 6, Resources: store.Resources{"tpu": 1}},
			store.NewTask{Key: "plain", Bucket: 6},
			store.NewTask{Kind: "other", Key: "o", Bucket: 6, Resources: store.Resources{"gpu": 9}},
		)
		held := b.hold("a", 6)
		// A row named by several reasons gets its key's, then the
		// resources', then its kind's, whatever the order given; of one
		// sort, the first given.
		reasons := []store.WaitReason{
			{Kind: "noop", AllKeys: true, Reason: "kind"},
			{Kind: "noop", AllKeys: true, Reason: "kind again"},
			{Kind: "noop", AllKeys: true, ByResources: true, Free: store.Resources{"gpu": 2}, Reason: "resources"},
			{Kind: "noop", LimitKey: "closed", Reason: "key"},
			{Kind: "noop", LimitKey: "closed", Reason: "key again"},
		}
		if n, err := b.s.SetWaitReasons(b.ctx, "a", held, reasons); err != nil || n != 5 {
			t.Fatalf("SetWaitReasons: %d rows, %v; want 5", n, err)
		}
		want := []string{"key", "kind", "resources", "resources", "kind", ""}
		for i, c := range created {
			if got := b.get(c.ID).WaitReason; got != want[i] {
				t.Errorf("task %s: wait reason %q, want %q", c.Key, got, want[i])
			}
		}
		// With no resource free at all, every task needing one is named.
		n, err := b.s.SetWaitReasons(b.ctx, "a", held, []store.WaitReason{
			{Kind: "noop", AllKeys: true, ByResources: true, Reason: "none free"}})
		if err != nil || n != 3 {
			t.Fatalf("SetWaitReasons with nothing free: %d rows, %v; want 3", n, err)
		}
		if got := b.get(created[1].ID).WaitReason; got != "none free" {
			t.Errorf("a task needing gpu=1 with nothing free has reason %q", got)
		}
		// Reasons by resources alone read only the rows that need some
		// (see the stores' resources index); what is free still decides.
		n, err = b.s.SetWaitReasons(b.ctx, "a", held, []store.WaitReason{
			{Kind: "noop", AllKeys: true, ByResources: true, Free: store.Resources{"gpu": 2}, Reason: "two free"}})
		if err != nil || n != 2 {
			t.Fatalf("SetWaitReasons with gpu=2 free: %d rows, %v; want 2 (gpu-3 and tpu)", n, err)
		}
		want = []string{"key", "none free", "two free", "two free", "kind", ""}
		for i, c := range created {
			if got := b.get(c.ID).WaitReason; got != want[i] {
				t.Errorf("task %s: wait reason %q, want %q", c.Key, got, want[i])
			}
		}
	})
}

func testLimitsFresh(t *testing.T, h Harness) {
	t.Run("ClaimSeesKeysBehindABusyKeysBacklog", func(t *testing.T) {
		b := setup(t, h)
		var nts []store.NewTask
		for range 20 {
			nts = append(nts, store.NewTask{Key: "big", Bucket: 4})
		}
		nts = append(nts, store.NewTask{Key: "small", Bucket: 4})
		b.create(nts...)
		held := b.hold("a", 4)
		// One slot free, the big key busy: its backlog fills the first
		// candidates (a scan of 5), but the key with nothing running comes
		// first.
		got := b.claimLimited("a", held, 1, store.LimitedClaim{
			Scan: 5,
			Keys: []store.KeyRoom{{Kind: "noop", Key: "big", Room: -1, Used: 3}},
		})
		if n := countByKey(got); n["small"] != 1 || len(got) != 1 {
			t.Errorf("claimed %v, want the small key's task", n)
		}
	})
}

func testLimitsRoundRobin(t *testing.T, h Harness) {
	t.Run("ClaimSeesKeysBehindTheFirstCandidatesKeys", func(t *testing.T) {
		b := setup(t, h)
		var nts []store.NewTask
		for range 20 {
			nts = append(nts, store.NewTask{Key: "big", Bucket: 4})
		}
		nts = append(nts, store.NewTask{Key: "small", Bucket: 4})
		b.create(nts...)
		held := b.hold("a", 4)
		// Nothing runs, so no key is busy; the big key's backlog fills the
		// first candidates (a scan of 5), and the second walk, which leaves
		// out their key, finds the small key. Both are in the first round:
		// the claim of two takes one of each.
		got := b.claimLimited("a", held, 2, store.LimitedClaim{Scan: 5})
		if n := countByKey(got); n["small"] != 1 || n["big"] != 1 {
			t.Errorf("claimed %v, want one task of each key", n)
		}
	})

	// The first candidates each of a key of its own do not make the second
	// walk needless when a key behind them could come first: a key ahead
	// in the round robin, a task that needs what is not free, a key with
	// no room.
	t.Run("ClaimSeesKeysBehindFirstCandidatesThatWaitTheirTurn", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "a", Bucket: 4}, store.NewTask{Key: "b", Bucket: 4}, store.NewTask{Key: "c", Bucket: 4},
			store.NewTask{Key: "d", Bucket: 4})
		held := b.hold("a", 4)
		got := b.claimLimited("a", held, 2, store.LimitedClaim{Scan: 3, Keys: []store.KeyRoom{
			{Kind: "noop", Key: "a", Room: -1, Turn: 1}, {Kind: "noop", Key: "b", Room: -1, Turn: 1},
			{Kind: "noop", Key: "c", Room: -1, Turn: 1},
		}})
		if n := countByKey(got); n["d"] != 1 || len(got) != 2 {
			t.Errorf("claimed %v, want d (turn 0) and one of a, b, c", n)
		}
	})
	t.Run("ClaimSeesKeysBehindFirstCandidatesThatDoNotFit", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "a", Bucket: 4, Resources: store.Resources{"gpu": 1}},
			store.NewTask{Key: "b", Bucket: 4, Resources: store.Resources{"gpu": 1}}, store.NewTask{Key: "c", Bucket: 4})
		held := b.hold("a", 4)
		got := b.claimLimited("a", held, 1, store.LimitedClaim{Scan: 2, Free: store.Resources{"gpu": 0}})
		if n := countByKey(got); n["c"] != 1 || len(got) != 1 {
			t.Errorf("claimed %v, want c", n)
		}
	})
	t.Run("ClaimSeesKeysBehindFirstCandidatesWithNoRoom", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "a", Bucket: 4}, store.NewTask{Key: "b", Bucket: 4}, store.NewTask{Key: "c", Bucket: 4})
		held := b.hold("a", 4)
		// Only the keys named have room.
		got := b.claimLimited("a", held, 1, store.LimitedClaim{Scan: 2,
			Kinds: []store.KindRoom{{Kind: "noop", Room: -1, KeyRoom: 0}},
			Keys:  []store.KeyRoom{{Kind: "noop", Key: "c", Room: 1}}})
		if n := countByKey(got); n["c"] != 1 || len(got) != 1 {
			t.Errorf("claimed %v, want c", n)
		}
	})

	// When the first candidates of keys not named fill the claim, the
	// claim may take them without ranking the rest; but a candidate as
	// early in the round robin that is not one of them (a key named with
	// no turn ahead and nothing running, as a rate limit names a key; a
	// task that needs free resources; a kind with a room of its own) still
	// takes its place in claim order.
	t.Run("ClaimTakesEveryCandidateOfTheRoundInClaimOrder", func(t *testing.T) {
		cases := []struct {
			name  string
			first store.NewTask
			kinds []string
			lc    store.LimitedClaim
		}{
			{"a key named with its turn", store.NewTask{Key: "first", Bucket: 4}, nil,
				store.LimitedClaim{Keys: []store.KeyRoom{{Kind: "noop", Key: "first", Room: 1}}}},
			{"a task that fits", store.NewTask{Key: "first", Bucket: 4, Resources: store.Resources{"gpu": 1}}, nil,
				store.LimitedClaim{Free: store.Resources{"gpu": 1}}},
			{"a kind with a room", store.NewTask{Kind: "train", Key: "first", Bucket: 4}, []string{"train", "noop"},
				store.LimitedClaim{Kinds: []store.KindRoom{{Kind: "train", Room: 5, KeyRoom: -1}}}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				b := setup(t, h)
				b.create(c.first)
				b.create(store.NewTask{Key: "u1", Bucket: 4})
				b.create(store.NewTask{Key: "u2", Bucket: 4})
				held := b.hold("a", 4)
				got := b.claimLimited("a", held, 2, c.lc, c.kinds...)
				if n := countByKey(got); n["first"] != 1 || n["u1"] != 1 || len(got) != 2 {
					t.Errorf("claimed %v, want first and u1, the first two in claim order", n)
				}
			})
		}
	})

	t.Run("ClaimTakesKeysInTurn", func(t *testing.T) {
		b := setup(t, h)
		var nts []store.NewTask
		for _, k := range []string{"a", "a", "a", "b", "b", "b", "c", "c", "c"} {
			nts = append(nts, store.NewTask{Key: k, Bucket: 4})
		}
		b.create(nts...)
		held := b.hold("a", 4)
		// Key a is one round ahead and key b two: of three starts, c takes
		// two (rounds 0 and 1) and a one (round 1); b waits for round 2.
		got := b.claimLimited("a", held, 3, store.LimitedClaim{Keys: []store.KeyRoom{
			{Kind: "noop", Key: "a", Room: -1, Turn: 1}, {Kind: "noop", Key: "b", Room: -1, Turn: 2},
		}})
		if n := countByKey(got); n["a"] != 1 || n["b"] != 0 || n["c"] != 2 {
			t.Errorf("claimed %v, want a=1 c=2", n)
		}
	})
}

func testLimitsKeyUse(t *testing.T, h Harness) {
	t.Run("KeyUseCountsActiveTasksByKindNodeAndLimitKey", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "x1", LimitKey: "tenant", Bucket: 1}, store.NewTask{Key: "x2", LimitKey: "tenant", Bucket: 1},
			store.NewTask{Key: "y", Bucket: 2}, store.NewTask{Key: "queued", Bucket: 3})
		b.claim("a", b.hold("a", 1), 10)
		b.claim("b", b.hold("b", 2), 10)
		got, err := b.s.ListKeyUse(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []store.KeyUse{
			{Kind: "noop", Node: nodeOf("a"), LimitKey: "tenant", Active: 2},
			{Kind: "noop", Node: nodeOf("b"), LimitKey: "y", Active: 1},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("key use %+v, want %+v (queued tasks are not counted)", got, want)
		}
	})
}
