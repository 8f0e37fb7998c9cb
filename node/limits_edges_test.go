package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// gpuKeyConfig is a node with one gpu whose kind train is limited to one
// running task per limit key.
func gpuKeyConfig(t *testing.T, b *testBundle) Config {
	cfg := b.config(t, "n1")
	cfg.Capacity = store.Resources{"gpu": 1}
	cfg.Limits = []store.Limit{{Name: "one", Kind: "train", Per: store.PerKey, Concurrency: 1}}
	return cfg
}

// TestLimitAnAbandonedAttemptReleasesItsSlotAndResources: an attempt given
// up without an outcome write (its task lease expired and the task was
// rescued) frees its key's slot and its gpu once its handler has returned:
// the next task of the key, needing the gpu, starts.
func TestLimitAnAbandonedAttemptReleasesItsSlotAndResources(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := gpuKeyConfig(t, b)
	cfg.ReconcileInterval = time.Minute
	cfg.TaskLeaseTTL = 24 * time.Hour // no renewal during the test
	started := make(chan int64, 2)
	n := b.startNode(t, cfg, map[string]Handler{"train": func(ctx context.Context, tk *task.Task) error {
		started <- tk.ID
		if tk.MaxAttempts == 1 { // the first: it runs until it is cancelled
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}})
	first := submit(t, n, SubmitRequest{Kind: "train", Key: "a", Resources: store.Resources{"gpu": 1}, MaxAttempts: 1})
	if got := receive(t, started, "the first task"); got != first.ID {
		t.Fatalf("task %d started, want %d", got, first.ID)
	}
	second := submit(t, n, SubmitRequest{Kind: "train", Key: "a", Resources: store.Resources{"gpu": 1}})
	if err := b.store.ExpireTaskLease(first.ID); err != nil {
		t.Fatal(err)
	}
	// The rescue cancels the first handler, which returns; the task is
	// lost (no attempt left), and its slot and gpu are free.
	b.advanceUntil(t, "the first task is rescued and the second runs", 10*time.Second, func() bool {
		return b.get(t, second.ID).Status == task.Succeeded
	})
	// Its handler returned: what it held is free, though its row may
	// still say running until the rescue's next pass writes it lost.
	b.advanceUntil(t, "the first task is lost", 10*time.Second, b.statusIs(t, first.ID, task.Lost))
	if got := receive(t, started, "the second task"); got != second.ID {
		t.Errorf("task %d started, want %d", got, second.ID)
	}
}

// TestLimitAStoppedHandlerPastItsGraceKeepsItsResources: a handler that
// ignores its stop has its task written stopped after the grace, but runs
// on: its gpu stays taken until it returns, so no second gpu task starts
// beside it on a one-gpu node.
func TestLimitAStoppedHandlerPastItsGraceKeepsItsResources(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := gpuKeyConfig(t, b)
	cfg.StopGrace = 50 * time.Millisecond
	release := make(chan struct{})
	stubborn := led.handler(nil)
	firstStarted := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"train": func(ctx context.Context, tk *task.Task) error {
		if tk.Key == "stubborn" {
			close(firstStarted)
			<-release // ignores ctx
			return nil
		}
		return stubborn(ctx, tk)
	}})
	first := submit(t, n, SubmitRequest{Kind: "train", Key: "stubborn", Resources: store.Resources{"gpu": 1}})
	receive(t, firstStarted, "the stubborn handler")
	second := submit(t, n, SubmitRequest{Kind: "train", Key: "other", Resources: store.Resources{"gpu": 1}})
	if _, err := commands.Stop(b.ctx, b.store, first.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task is stopped after the grace period", b.statusIs(t, first.ID, task.Stopped))
	claimPassesAfter(t, n)
	if got := led.started(); got != 0 {
		t.Fatalf("a second gpu task started beside a stopped handler that still runs on the node's one gpu")
	}
	close(release)
	eventually(t, "the second task runs once the stubborn handler returned", b.statusIs(t, second.ID, task.Succeeded))
}

// TestLimitAnAttemptIsReleasedOnceWhateverTheOrderOfItsEnds: what an
// attempt holds is freed once its handler has returned and its outcome is
// written or given up, in either order, and once only.
func TestLimitAnAttemptIsReleasedOnceWhateverTheOrderOfItsEnds(t *testing.T) {
	for _, c := range []struct {
		name  string
		ends  [][2]bool // (returned, settled) in order
		after int       // the end after which it is freed (index)
	}{
		{"returned then written", [][2]bool{{true, false}, {false, true}, {false, true}}, 1},
		{"written then returned", [][2]bool{{false, true}, {true, true}, {false, true}}, 1},
		{"abandoned", [][2]bool{{true, true}, {false, true}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &attempt{}
			for i, e := range c.ends {
				if got := a.over(e[0], e[1]); got != (i == c.after) {
					t.Errorf("end %d %v: release %v, want %v", i, e, got, i == c.after)
				}
			}
		})
	}
}

// TestLimitGracefulShutdownGivesBackItsFleetShare: a node that shuts down
// gives back its share of a fleet-wide limit with its buckets, so that the
// other holders may use the whole limit at once rather than a lease TTL
// (a minute here) later.
func TestLimitGracefulShutdownGivesBackItsFleetShare(t *testing.T) {
	b := setup(t)
	led := newLedger()
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 2}
	gate := make(chan struct{})
	var nodes []*Node
	for i, bs := range [][]int{b.bucketRange(0, 32), b.bucketRange(32, 64)} {
		cfg := b.config(t, fmt.Sprintf("n%d", i), bs...)
		cfg.Limits = []store.Limit{lim}
		cfg.BucketLeaseHeartbeat = 20 * time.Second
		cfg.BucketLeaseTTL = time.Minute
		nodes = append(nodes, b.startNode(t, cfg, map[string]Handler{"train": led.handler(gate)}))
	}
	t.Cleanup(func() { close(gate) }) // before the nodes' shutdowns
	leaving, staying := nodes[0], nodes[1]
	// One long task in the leaving node's buckets, two in the staying
	// node's: each runs one, at a share of 1.
	first := submit(t, leaving, SubmitRequest{Kind: "train", Key: b.keysIn(leaving.cfg.Buckets, 1)[0]})
	eventually(t, "the leaving node runs its task", b.statusIs(t, first.ID, task.Running))
	var stayingIDs []int64
	for _, key := range b.keysIn(staying.cfg.Buckets, 2) {
		stayingIDs = append(stayingIDs, submit(t, staying, SubmitRequest{Kind: "train", Key: key}).ID)
	}
	eventually(t, "two running, one on each node", func() bool { return led.started() == 2 })
	claimPassesAfter(t, staying)
	if got := led.started(); got != 2 {
		t.Fatalf("%d running under a fleet limit of 2", got)
	}
	// A context ended already: Shutdown cancels the running handler at
	// once, and its task is released.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if err := leaving.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	shares, err := b.store.ListShares(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shares {
		if sh.Owner == leaving.incarnation && sh.Alive && sh.Share > 0 {
			t.Fatalf("after its shutdown, %s still holds a share of %d of %s until %v", sh.Node, sh.Share, sh.Limit, sh.ExpiresAt)
		}
	}
	eventually(t, "both of the staying node's tasks run", func() bool {
		return b.get(t, stayingIDs[0]).Status == task.Running && b.get(t, stayingIDs[1]).Status == task.Running
	})
}

// TestLimitKeylessTasksRunBesideEachOther: tasks submitted without a key
// land in random buckets and are under no per-key limit: three run at once
// under a limit of one per key.
func TestLimitKeylessTasksRunBesideEachOther(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Limits = []store.Limit{{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1}}
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"job": led.handler(gate)})
	t.Cleanup(func() { close(gate) })
	for range 3 {
		submit(t, n, SubmitRequest{Kind: "job"})
	}
	eventually(t, "three keyless tasks run at once", func() bool { return led.started() == 3 })
}

// TestLimitATaskThatCanNeverStartHoldsNoFleetShare: a holder whose only
// queued task needs two gpus and has one asks for no share of a fleet-wide
// limit of 1, so another holder's runnable task starts.
func TestLimitATaskThatCanNeverStartHoldsNoFleetShare(t *testing.T) {
	b := setup(t)
	led := newLedger()
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 1}
	config := func(id string, buckets []int) Config {
		cfg := b.config(t, id, buckets...)
		cfg.Limits = []store.Limit{lim}
		cfg.Capacity = store.Resources{"gpu": 1}
		cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
		cfg.BucketLeaseTTL = time.Minute
		return cfg
	}
	first := b.startNode(t, config("n0", b.bucketRange(0, 32)), map[string]Handler{"train": led.handler(nil)})
	submit(t, first, SubmitRequest{Kind: "train", Key: b.keysIn(first.cfg.Buckets, 1)[0], Resources: store.Resources{"gpu": 2}})
	eventually(t, "n0 took its share after the task was queued", func() bool {
		shares, err := b.store.ListShares(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range shares {
			if sh.Owner == first.incarnation && sh.Alive {
				return first.claimPasses.Load() > 0 && len(first.LimitUse()) > 0
			}
		}
		return false
	})
	claimPassesAfter(t, first)
	second := b.startNode(t, config("n1", b.bucketRange(32, 64)), map[string]Handler{"train": led.handler(nil)})
	tk := submit(t, second, SubmitRequest{Kind: "train", Key: b.keysIn(second.cfg.Buckets, 1)[0]})
	eventually(t, "n1's runnable task runs", b.statusIs(t, tk.ID, task.Succeeded))
}

// TestLimitRoundRobinHoldsForTasksThatNeedAGpu is the case: on a
// node with one gpu, 40 queued gpu tasks of one key older than one of
// another key: the other key's task starts second, not last.
func TestLimitRoundRobinHoldsForTasksThatNeedAGpu(t *testing.T) {
	b := setup(t)
	led := newLedger()
	gpu := store.Resources{"gpu": 1}
	var nts []store.NewTask
	for i := range 40 {
		nts = append(nts, store.NewTask{Kind: "train", Key: fmt.Sprintf("hot-%d", i), LimitKey: "hot",
			Bucket: b.policy.Of("hot"), Resources: gpu, MaxAttempts: 1})
	}
	nts = append(nts, store.NewTask{Kind: "train", Key: "cold", Bucket: b.policy.Of("cold"), Resources: gpu, MaxAttempts: 1})
	if _, err := b.store.CreateTasks(b.ctx, nts); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "n1")
	cfg.Capacity = gpu
	b.startNode(t, cfg, map[string]Handler{"train": led.handler(nil)})
	eventually(t, "all 41 ran", func() bool { return led.started() == 41 })
	led.mu.Lock()
	defer led.mu.Unlock()
	at := slices.Index(led.order, "cold")
	if at > 1 {
		t.Errorf("the cold key's one task started %d of 41, after %d of the hot key's; want second", at+1, at)
	}
}
