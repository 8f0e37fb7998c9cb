package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func span(lo, hi int) []int {
	out := make([]int, 0, hi-lo+1)
	for b := lo; b <= hi; b++ {
		out = append(out, b)
	}
	return out
}

func noop(context.Context, *task.Task) error { return nil }

func TestANodeOfEveryBucketRunsEveryTask(t *testing.T) {
	b := setup(t)
	var ran atomic.Int64
	n := b.startNode(t, b.config(t, "solo"), map[string]Handler{
		"work": func(context.Context, *task.Task) error { ran.Add(1); return nil },
	})
	if got := len(n.Held()); got != testBuckets {
		t.Fatalf("Start returned holding %d buckets, want all %d", got, testBuckets)
	}

	reqs := make([]SubmitRequest, 200)
	for i := range reqs {
		reqs[i] = SubmitRequest{Kind: "work", Key: fmt.Sprintf("tenant-%d", i)}
		if i%10 == 0 {
			reqs[i].Key = "" // a node of every bucket takes tasks without a key
		}
	}
	tasks, err := n.SubmitMany(b.ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "all 200 tasks succeeded", func() bool {
		return b.countByStatus(t)[task.Succeeded] == len(tasks)
	})
	for _, tk := range tasks {
		if got := b.trail(t, tk.ID); got != "queued running succeeded" {
			t.Errorf("task %d trail %q, want queued running succeeded", tk.ID, got)
		}
		if got := b.get(t, tk.ID); got.Node != "solo" || got.Attempt != 1 {
			t.Errorf("task %d ran on %q at attempt %d", tk.ID, got.Node, got.Attempt)
		}
	}
	if got := ran.Load(); got != int64(len(tasks)) {
		t.Errorf("handlers ran %d times for %d tasks", got, len(tasks))
	}
}

// Invariant 1: a node claims only in buckets it holds.
func TestEveryTaskRunsOnTheHolderOfItsBucket(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	ranBy := map[int64][]string{}
	handler := func(name string) Handler {
		return func(_ context.Context, tk *task.Task) error {
			mu.Lock()
			ranBy[tk.ID] = append(ranBy[tk.ID], name)
			mu.Unlock()
			return nil
		}
	}
	low := b.startNode(t, b.config(t, "low", span(0, 31)...), map[string]Handler{"work": handler("low")})
	high := b.startNode(t, b.config(t, "high", span(32, 63)...), map[string]Handler{"work": handler("high")})
	for _, h := range low.Held() {
		if h.Bucket > 31 {
			t.Errorf("low holds bucket %d", h.Bucket)
		}
	}
	if len(low.Held()) != 32 || len(high.Held()) != 32 {
		t.Fatalf("held %d and %d buckets, want 32 each", len(low.Held()), len(high.Held()))
	}

	owner := map[int64]string{}
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("account-%d", i)
		via, name := low, "low"
		if b.policy.Of(key) >= 32 {
			via, name = high, "high"
		}
		owner[submit(t, via, SubmitRequest{Kind: "work", Key: key}).ID] = name
	}
	eventually(t, "all tasks succeeded", func() bool { return b.countByStatus(t)[task.Succeeded] == len(owner) })

	mu.Lock()
	defer mu.Unlock()
	for id, want := range owner {
		if got := ranBy[id]; len(got) != 1 || got[0] != want {
			t.Errorf("task %d (bucket %d) ran on %v, want once on %s", id, b.get(t, id).Bucket, got, want)
		}
		if got := b.get(t, id); got.Node != want {
			t.Errorf("task %d recorded node %q, want %q", id, got.Node, want)
		}
	}
}

func TestAStandbyTakesOverWhenTheHolderStopsRenewing(t *testing.T) {
	b := setup(t)
	// The holder runs another kind, so the tasks wait in its buckets; with
	// an hour-long heartbeat it renews nothing during the test, like a
	// process that froze.
	// Neither balances: a node that does not stands by for what a live
	// node holds, as every node did before balancing.
	frozen := b.config(t, "holder", span(0, 31)...)
	frozen.BucketLeaseTTL = 2 * time.Hour
	frozen.NoBalance = true
	b.startNode(t, frozen, map[string]Handler{"other": noop})

	var ran atomic.Int64
	standbyCfg := b.config(t, "standby", span(0, 31)...)
	standbyCfg.NoBalance = true
	standby := b.startNode(t, standbyCfg, map[string]Handler{
		"work": func(context.Context, *task.Task) error { ran.Add(1); return nil },
	})
	if held := standby.Held(); len(held) != 0 {
		t.Fatalf("the standby holds %v while the holder lives", held)
	}
	var ids []int64
	for _, key := range b.keysIn(bucket.Of(span(0, 31)...), 20) {
		ids = append(ids, submit(t, standby, SubmitRequest{Kind: "work", Key: key}).ID)
	}
	claimPassesAfter(t, standby)
	if got := b.countByStatus(t)[task.Queued]; got != len(ids) || ran.Load() != 0 {
		t.Fatalf("while standing by: %d of %d tasks queued, %d ran", got, len(ids), ran.Load())
	}

	for bk := 0; bk < 32; bk++ {
		if err := b.store.ExpireBucketLease(bk); err != nil {
			t.Fatal(err)
		}
	}
	standby.leaseLoop.poke() // its next heartbeat, without waiting for it
	eventually(t, "the standby ran the waiting tasks", func() bool {
		return b.countByStatus(t)[task.Succeeded] == len(ids)
	})
	for _, id := range ids {
		if got := b.get(t, id); got.Node != "standby" || got.Epoch != 2 {
			t.Errorf("task %d ran on %q under epoch %d, want standby under epoch 2", id, got.Node, got.Epoch)
		}
	}
	if held := standby.Held(); len(held) != 32 {
		t.Errorf("the standby holds %d buckets after the takeover, want 32", len(held))
	}
}

func TestStartRefusesBucketsBeyondTheFleetBeforeTakingAnyLease(t *testing.T) {
	b := setup(t)
	n := b.newNode(t, b.config(t, "too-far", span(60, 70)...), map[string]Handler{"work": noop})
	err := n.Start(b.ctx)
	if !errors.Is(err, bucket.ErrInvalidSet) {
		t.Fatalf("Start with buckets 60-70 in a fleet of 64: %v, want bucket.ErrInvalidSet", err)
	}
	var re *bucket.RangeError
	if !errors.As(err, &re) || re.Bucket != 64 || re.Count != testBuckets {
		t.Errorf("error %v does not name bucket 64 of %d", err, testBuckets)
	}
	leases, err := b.store.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Holder != "" || l.Epoch != 0 {
			t.Errorf("bucket %d was touched by a node that refused to start: %+v", l.Bucket, l)
		}
	}
	if nodes, _ := b.store.ListNodes(b.ctx); len(nodes) != 0 {
		t.Errorf("a node that refused to start is registered: %+v", nodes)
	}
}

func TestASecondProcessWithTheSameNodeIDIsRefused(t *testing.T) {
	b := setup(t)
	first := b.startNode(t, b.config(t, "twin"), map[string]Handler{"work": noop})
	second := b.newNode(t, b.config(t, "twin"), map[string]Handler{"work": noop})
	err := second.Start(b.ctx)
	var alive *store.NodeAliveError
	if !errors.As(err, &alive) || alive.Incarnation != first.Incarnation() {
		t.Fatalf("second Start: %v, want *store.NodeAliveError naming %s", err, first.Incarnation())
	}
	leases, _ := b.store.ListBuckets(b.ctx)
	for _, l := range leases {
		if l.Holder != first.Incarnation() {
			t.Errorf("bucket %d held by %q, want the first process", l.Bucket, l.Holder)
		}
	}
}

func TestTheClaimLoopWakesOnANotification(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "listener")
	cfg.PollInterval = time.Hour
	n := b.startNode(t, cfg, map[string]Handler{"work": noop})
	// The pass at start and the one for the buckets acquired in Start;
	// after them the loop sleeps until a poke or the hour-long poll.
	eventually(t, "the start-up claim passes", func() bool { return n.claimPasses.Load() >= 2 })

	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k"})
	eventually(t, "the task ran", b.statusIs(t, tk.ID, task.Succeeded))
}

func TestNoMoreThanConcurrencyHandlersRunAtOnce(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	var current, peak atomic.Int32
	cfg := b.config(t, "narrow")
	cfg.Concurrency = 3
	n := b.startNode(t, cfg, map[string]Handler{
		"block": func(ctx context.Context, _ *task.Task) error {
			c := current.Add(1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			defer current.Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	})
	for i := 0; i < 10; i++ {
		submit(t, n, SubmitRequest{Kind: "block", Key: fmt.Sprintf("k%d", i)})
	}
	eventually(t, "three handlers running", func() bool { return current.Load() == 3 })
	claimPassesAfter(t, n) // the loop looked again with every slot taken
	counts := b.countByStatus(t)
	if counts[task.Running] != 3 || counts[task.Queued] != 7 {
		t.Fatalf("with concurrency 3: %v, want 3 running and 7 queued", counts)
	}
	close(release)
	eventually(t, "all ten succeeded", func() bool { return b.countByStatus(t)[task.Succeeded] == 10 })
	if p := peak.Load(); p > 3 {
		t.Errorf("%d handlers ran at once with concurrency 3", p)
	}
}

func TestLosingABucketCancelsItsHandlersAndFencesTheirOutcome(t *testing.T) {
	b := setup(t)
	started := make(chan *task.Task, 1)
	causes := make(chan error, 1)
	old := b.startNode(t, b.config(t, "old"), map[string]Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			started <- tk
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil // claims success anyway: the node must not record it
		},
	})
	tk := submit(t, old, SubmitRequest{Kind: "work", Key: "tenant-7"})
	running := receive(t, started, "the handler to start")

	// The old node's lease on the task's bucket lapses (a partition, a
	// long pause) and another node takes the bucket under a new epoch.
	if err := b.store.ExpireBucketLease(tk.Bucket); err != nil {
		t.Fatal(err)
	}
	successor := b.startNode(t, b.config(t, "new", tk.Bucket), map[string]Handler{"other": noop})
	if held := successor.Held(); len(held) != 1 || held[0].Epoch != running.Epoch+1 {
		t.Fatalf("successor holds %v, want bucket %d at epoch %d", held, tk.Bucket, running.Epoch+1)
	}
	old.leaseLoop.poke() // the old node's next renewal learns of it

	if cause := receive(t, causes, "the handler's cancellation"); !errors.Is(cause, ErrBucketLost) {
		t.Errorf("handler cancelled with %v, want ErrBucketLost", cause)
	}
	eventually(t, "the old node dropped the attempt", func() bool {
		registered, _, _ := old.attempts.counts()
		return registered == 0
	})
	got := b.get(t, tk.ID)
	if got.Status == task.Succeeded {
		t.Fatal("the old node recorded success for a task whose bucket it had lost")
	}
	// The successor rescues the task it found claimed under the old epoch;
	// the old node writes nothing more about it.
	events, err := b.store.TaskEvents(b.ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events[2:] { // after the creation and the old node's claim
		if ev.Node == old.ID() {
			t.Errorf("trail %q: the old node wrote about an attempt it had lost: %+v", b.trail(t, tk.ID), ev)
		}
	}
	// And a late write would be fenced by the store in any case.
	outs, err := b.store.AdvanceActive(b.ctx, old.Incarnation(), []store.ActiveTransition{
		{Ref: running.Ref(), To: task.Succeeded, Node: old.ID()},
	})
	if err != nil || !errors.Is(outs[0].Err, store.ErrFenced) {
		t.Errorf("late completion: %v, %+v; want ErrFenced", err, outs)
	}
	if _, ok := old.keeper.Holds(tk.Bucket); ok {
		t.Error("the old node still serves the lost bucket")
	}
	if got := len(old.Held()); got != testBuckets-1 {
		t.Errorf("the old node holds %d buckets, want the other %d", got, testBuckets-1)
	}
}

func TestAnAttemptWhoseTaskLeaseIsNotRenewedIsCancelled(t *testing.T) {
	b := setup(t)
	started := make(chan *task.Task, 1)
	causes := make(chan error, 1)
	n := b.startNode(t, b.config(t, "renewer"), map[string]Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			started <- tk
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k"})
	receive(t, started, "the handler to start")
	// Another attempt superseded this one (as a rescue would): the task
	// left running behind the node's back.
	cur := b.get(t, tk.ID)
	if _, err := b.store.Transition(b.ctx, store.Transition{
		ID: tk.ID, Version: cur.StatusVersion, To: task.Retrying, Reason: "rescued by test", Delay: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	n.renewer.loop.poke()
	if cause := receive(t, causes, "the handler's cancellation"); !errors.Is(cause, ErrTaskLeaseLost) {
		t.Errorf("handler cancelled with %v, want ErrTaskLeaseLost", cause)
	}
	eventually(t, "the attempt was dropped", func() bool {
		return len(n.attempts.ofTask(cur.ID)) == 0
	})
}

// withoutNotifications hides the store's Notifier, as a store that has none.
type withoutNotifications struct{ store.Store }

func TestANodeWithoutNotificationsPolls(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "poller")
	cfg.PollInterval = 20 * time.Millisecond
	n, err := New(withoutNotifications{b.store.Handle()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.Register("work", noop)
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	reqs := make([]SubmitRequest, 50)
	for i := range reqs {
		reqs[i] = SubmitRequest{Kind: "work", Key: fmt.Sprintf("k%d", i)}
	}
	if _, err := n.SubmitMany(b.ctx, reqs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "all succeeded", func() bool { return b.countByStatus(t)[task.Succeeded] == len(reqs) })
}

func TestANodeBuiltForAnotherBucketCountRefusesToStart(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "wrong-count")
	cfg.NumBuckets = testBuckets * 2
	n := b.newNode(t, cfg, map[string]Handler{"work": noop})
	err := n.Start(b.ctx)
	var ce *store.BucketCountError
	if !errors.As(err, &ce) || ce.Fleet != testBuckets || ce.Requested != testBuckets*2 {
		t.Fatalf("Start with %d buckets in a fleet of %d: %v, want *store.BucketCountError", testBuckets*2, testBuckets, err)
	}
	if leases, _ := b.store.ListBuckets(b.ctx); leases[0].Holder != "" {
		t.Errorf("a node that refused to start took bucket 0: %+v", leases[0])
	}
}

// A task becomes claimable again while the handler of its earlier attempt,
// given up but ignoring its cancellation, still runs on this node. The node
// claims it, but must not run it beside that handler: the new attempt is
// given up unrun, and the task runs again only once the old handler has
// returned.
func TestANodeNeverRunsANewAttemptBesideAnOldOneThatStillRuns(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.config(t, "solo")
	cfg.TaskLeaseTTL = 3 * time.Second
	cfg.ReconcileInterval = time.Second
	cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, time.Millisecond
	started := make(chan int, 4)
	release := make(chan struct{})
	var running sync.Mutex // held by each execution: TryLock fails on an overlap
	overlaps := make(chan int, 4)
	n := b.startNode(t, cfg, map[string]Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			if !running.TryLock() {
				overlaps <- tk.Attempt
				return nil
			}
			defer running.Unlock()
			started <- tk.Attempt
			if tk.Attempt == 1 {
				<-release // ignores its cancellation
			}
			return nil
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k", MaxAttempts: 5})
	if got := receive(t, started, "attempt 1"); got != 1 {
		t.Fatalf("attempt %d started, want 1", got)
	}
	// Moved on behind the node's back, as another holder's rescue would;
	// due at once, so the claim loop takes it again.
	cur := b.get(t, tk.ID)
	if _, err := b.store.Transition(b.ctx, store.Transition{
		ID: tk.ID, Version: cur.StatusVersion, To: task.Retrying, Reason: "rescued by test",
	}); err != nil {
		t.Fatal(err)
	}
	n.claimLoop.poke()
	eventually(t, "attempt 2 is claimed", func() bool { return b.get(t, tk.ID).Attempt == 2 })
	// The pass that claimed it launches it before it ends: once a pass has
	// ended after this point, attempt 2 has been launched, and given up.
	passes := n.claimPasses.Load()
	b.advanceUntil(t, "a claim pass ends", 100*time.Millisecond, func() bool { return n.claimPasses.Load() > passes })
	eventually(t, "attempt 2 is given up unrun", func() bool {
		for _, a := range n.attempts.ofTask(tk.ID) {
			if a.ref.ClaimSeq == 2 {
				return false
			}
		}
		return true
	})
	select {
	case got := <-started:
		t.Fatalf("attempt %d started while attempt 1's handler still ran", got)
	default:
	}
	close(release) // attempt 1's handler returns at last
	// Attempt 2's lease lapses; the rescue retries the task, and attempt 3
	// runs alone.
	b.advanceUntil(t, "the task succeeds", 500*time.Millisecond, b.statusIs(t, tk.ID, task.Succeeded))
	if got := receive(t, started, "the next attempt"); got != 3 {
		t.Errorf("attempt %d ran after the old handler returned, want 3", got)
	}
	select {
	case a := <-overlaps:
		t.Errorf("attempt %d ran beside another", a)
	default:
	}
	if trail := b.trail(t, tk.ID); trail != "queued running retrying running retrying running succeeded" {
		t.Errorf("trail %q", trail)
	}
}
