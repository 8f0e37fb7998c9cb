package node

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// balancing is a test config whose leases renew often, so that nodes see
// each other, and balance, within a fraction of a second.
func (b *testBundle) balancing(t *testing.T, id string, buckets ...int) Config {
	cfg := b.config(t, id, buckets...)
	cfg.BucketLeaseTTL = 3 * time.Second
	cfg.BucketLeaseHeartbeat = 100 * time.Millisecond
	return cfg
}

// holders reads who holds each bucket in the store, by node id.
func (b *testBundle) holders(t *testing.T) map[string]int {
	t.Helper()
	leases, err := b.store.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range leases {
		out[l.Node]++
	}
	return out
}

func (b *testBundle) lease(t *testing.T, bk int) store.BucketLease {
	t.Helper()
	leases, err := b.store.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return leases[bk]
}

func TestNodesThatDeclareTheSameBucketsShareThem(t *testing.T) {
	b := setup(t)
	nodes := []*Node{b.startNode(t, b.balancing(t, "a"), map[string]Handler{"work": noop})}
	if got := len(nodes[0].Held()); got != testBuckets {
		t.Fatalf("the first node holds %d buckets, want all %d", got, testBuckets)
	}
	for _, id := range []string{"b", "c", "d"} {
		nodes = append(nodes, b.startNode(t, b.balancing(t, id), map[string]Handler{"work": noop}))
	}
	eventually(t, "each of four nodes holds 16 buckets", func() bool {
		for _, n := range nodes {
			if len(n.Held()) != 16 {
				return false
			}
		}
		return true
	})
	if got := b.holders(t); len(got) != 4 || got["a"] != 16 || got["b"] != 16 || got["c"] != 16 || got["d"] != 16 {
		t.Errorf("the store says the buckets are held by %v, want 16 each by a, b, c and d", got)
	}
	// Each node's share is as of its last balance pass, which may come a
	// heartbeat after the others have moved.
	eventually(t, "each node's share is 16", func() bool {
		for _, n := range nodes {
			if n.Share() != 16 {
				return false
			}
		}
		return true
	})
	// The first node gave each newcomer a range, not every fourth bucket.
	if got := bucket.Of(heldBuckets(nodes[0])...).String(); strings.Contains(got, ",") {
		t.Logf("the first node kept %s", got)
	}
}

func heldBuckets(n *Node) []int {
	var out []int
	for _, h := range n.Held() {
		out = append(out, h.Bucket)
	}
	return out
}

func TestDisjointDeclarationsAreNotBalanced(t *testing.T) {
	b := setup(t)
	a := b.startNode(t, b.balancing(t, "a", span(0, 47)...), map[string]Handler{"work": noop})
	c := b.startNode(t, b.balancing(t, "c", span(48, 63)...), map[string]Handler{"work": noop})
	passesOf(t, a, 3)
	passesOf(t, c, 3)
	if got := len(a.Held()); got != 48 {
		t.Errorf("a holds %d of the 48 buckets only it declares", got)
	}
	if got := len(c.Held()); got != 16 {
		t.Errorf("c holds %d of the 16 buckets only it declares", got)
	}
}

// passesOf waits until n has run count more bucket lease passes.
func passesOf(t *testing.T, n *Node, count int64) {
	t.Helper()
	target := n.leasePasses.Load() + count
	eventually(t, "more bucket lease passes of "+n.ID(), func() bool {
		n.leaseLoop.poke()
		return n.leasePasses.Load() >= target
	})
}

// gatedHandler runs until its gate closes or its context ends, and
// reports each start.
type gatedHandler struct {
	gate    chan struct{}
	started chan int64
	runs    atomic.Int64
}

func newGated() *gatedHandler {
	return &gatedHandler{gate: make(chan struct{}), started: make(chan int64, 100)}
}

func (g *gatedHandler) handle(ctx context.Context, tk *task.Task) error {
	g.runs.Add(1)
	g.started <- tk.ID
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// TestAHandOffWaitsForTheBucketsRunningTasks: a bucket that must move
// stops being claimed in at once, but moves only once the task running
// there has finished, and its successor claims there at once.
func TestAHandOffWaitsForTheBucketsRunningTasks(t *testing.T) {
	b := setup(t)
	bk := 9
	g := newGated()
	giverCfg := b.balancing(t, "giver")
	giverCfg.PollInterval = time.Hour // claims only when woken
	giver := b.startNode(t, giverCfg, map[string]Handler{"work": g.handle})
	keys := b.keysIn(bucket.Of(bk), 2)
	first := submit(t, giver, SubmitRequest{Kind: "work", Key: keys[0]})
	receive(t, g.started, "the first task's start")
	oldEpoch, _ := giver.keeper.Holds(bk)

	// The newcomer declares only bucket 9: balance gives it that bucket.
	var ran atomic.Int64
	takerCfg := b.balancing(t, "taker", bk)
	takerCfg.PollInterval = time.Hour
	b.startNode(t, takerCfg, map[string]Handler{"work": func(context.Context, *task.Task) error {
		ran.Add(1)
		return nil
	}})
	eventually(t, "the giver marks bucket 9 for the taker", func() bool {
		return b.lease(t, bk).Successor == "taker"
	})
	if l := b.lease(t, bk); l.Node != "giver" || l.Epoch != oldEpoch {
		t.Fatalf("bucket 9 while its task runs: %+v, want still the giver's at epoch %d", l, oldEpoch)
	}
	second := submit(t, giver, SubmitRequest{Kind: "work", Key: keys[1]})
	claimPassesAfter(t, giver)
	if got := b.get(t, second.ID).Status; got != task.Queued {
		t.Fatalf("a task submitted to a bucket being handed over is %s on its giver, want queued", got)
	}

	close(g.gate)
	eventually(t, "the taker holds bucket 9 and ran the second task", func() bool {
		return b.get(t, second.ID).Status == task.Succeeded
	})
	if got := b.get(t, first.ID); got.Status != task.Succeeded || got.Node != "giver" || got.Epoch != oldEpoch {
		t.Errorf("the first task is %s on %s under epoch %d, want succeeded on the giver under %d",
			got.Status, got.Node, got.Epoch, oldEpoch)
	}
	if got := b.get(t, second.ID); got.Node != "taker" || got.Epoch != oldEpoch+1 || got.Attempt != 1 {
		t.Errorf("the second task ran on %s under epoch %d, attempt %d; want the taker, epoch %d, attempt 1",
			got.Node, got.Epoch, got.Attempt, oldEpoch+1)
	}
	if _, held := giver.keeper.Holds(bk); held {
		t.Error("the giver still holds bucket 9")
	}
	if l := b.lease(t, bk); l.Node != "taker" || l.HandedBy != "" || l.Successor != "" {
		t.Errorf("bucket 9 after the hand-off: %+v, want the taker's, taken up", l)
	}
}

// TestAHandOffTimeoutReleasesTheTask: a handler still running when the
// hand-off timeout passes is cancelled; its task goes back to queued, the
// attempt not counted, and the successor runs it.
func TestAHandOffTimeoutReleasesTheTask(t *testing.T) {
	b := setup(t)
	bk := 9
	g := newGated()
	giverCfg := b.balancing(t, "giver")
	giverCfg.HandoffTimeout = 200 * time.Millisecond
	giver := b.startNode(t, giverCfg, map[string]Handler{"work": g.handle})
	stuck := submit(t, giver, SubmitRequest{Kind: "work", Key: b.keysIn(bucket.Of(bk), 1)[0]})
	receive(t, g.started, "the task's start")

	b.startNode(t, b.balancing(t, "taker", bk), map[string]Handler{"work": noop})
	eventually(t, "the taker runs the released task", func() bool {
		return b.get(t, stuck.ID).Status == task.Succeeded
	})
	got := b.get(t, stuck.ID)
	if got.Node != "taker" || got.Attempt != 1 {
		t.Errorf("the task ended on %s at attempt %d, want on the taker at attempt 1 (the released one not counted)",
			got.Node, got.Attempt)
	}
	if trail := b.trail(t, stuck.ID); trail != "queued running queued running succeeded" {
		t.Errorf("trail %q, want queued running queued running succeeded", trail)
	}
	events, err := b.store.TaskEvents(b.ctx, stuck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := events[2].Reason; r != "released at the hand-off of its bucket" {
		t.Errorf("the release reads %q", r)
	}
}

// TestShutdownHandsEveryBucketToTheNodesThatDeclareIt: SIGTERM's shutdown
// gives each bucket to another node that declares it, through the hand-off,
// with no lease left to lapse (the TTL here is an hour).
func TestShutdownHandsEveryBucketToTheNodesThatDeclareIt(t *testing.T) {
	b := setup(t)
	cfg := func(id string) Config {
		c := b.balancing(t, id)
		c.BucketLeaseTTL = time.Hour
		return c
	}
	a := b.startNode(t, cfg("a"), map[string]Handler{"work": noop})
	c := b.startNode(t, cfg("c"), map[string]Handler{"work": noop})
	d := b.startNode(t, cfg("d"), map[string]Handler{"work": noop})
	eventually(t, "the three share the buckets", func() bool {
		return len(a.Held())+len(c.Held())+len(d.Held()) == testBuckets && len(a.Held()) >= 21 && len(c.Held()) >= 21 &&
			len(d.Held()) >= 21
	})
	leaving := bucket.Of(heldBuckets(c)...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// Shutdown returned: every bucket c held is already someone else's.
	got := b.holders(t)
	if got["c"] != 0 || got[""] != 0 || got["a"]+got["d"] != testBuckets {
		t.Errorf("after c's shutdown the buckets are held by %v, want all by a and d", got)
	}
	for _, bk := range leaving.Slice() {
		if l := b.lease(t, bk); l.HandedBy != "c" && l.HandedBy != "" {
			t.Errorf("bucket %d was handed by %q", bk, l.HandedBy)
		}
	}
	eventually(t, "a and d share the 64 buckets evenly", func() bool {
		return len(a.Held()) == 32 && len(d.Held()) == 32
	})
}

// TestAPinMovesABucketAndHoldsIt: an operator's pin moves a bucket to the
// node named; balance then works around it.
func TestAPinMovesABucketAndHoldsIt(t *testing.T) {
	b := setup(t)
	a := b.startNode(t, b.balancing(t, "a"), map[string]Handler{"work": noop})
	c := b.startNode(t, b.balancing(t, "c"), map[string]Handler{"work": noop})
	eventually(t, "a and c hold 32 each", func() bool { return len(a.Held()) == 32 && len(c.Held()) == 32 })
	var fromA []int
	for _, h := range a.Held() {
		if len(fromA) < 3 {
			fromA = append(fromA, h.Bucket)
		}
	}
	if err := b.store.PinBuckets(b.ctx, bucket.Of(fromA...), "c"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c holds the buckets pinned to it", func() bool {
		for _, bk := range fromA {
			if _, ok := c.keeper.Holds(bk); !ok {
				return false
			}
		}
		return true
	})
	eventually(t, "the rest are shared evenly again", func() bool { return len(a.Held()) == 32 && len(c.Held()) == 32 })
	for _, bk := range fromA {
		if _, ok := c.keeper.Holds(bk); !ok {
			t.Errorf("bucket %d, pinned to c, went back to a", bk)
		}
	}
}

// TestAHandedBucketLeavesTheLimiter: the giver's limiter forgets a bucket
// handed over, and the successor's treats it as any bucket taken under a
// new epoch: not ready for a limited claim until it has read its rows.
func TestAHandedBucketLeavesTheLimiter(t *testing.T) {
	b := setup(t)
	lim := store.Limit{Name: "api", Kind: "work", Per: store.PerKey, Concurrency: 2}
	cfg := b.balancing(t, "giver")
	cfg.Limits = []store.Limit{lim}
	giver := b.startNode(t, cfg, map[string]Handler{"work": noop})
	bk := 9
	eventually(t, "the giver's limiter has bucket 9 ready", func() bool {
		giver.limits.mu.Lock()
		defer giver.limits.mu.Unlock()
		_, ready := giver.limits.ready[bk]
		return ready
	})
	takerCfg := b.balancing(t, "taker", bk)
	takerCfg.Limits = []store.Limit{lim}
	taker := b.startNode(t, takerCfg, map[string]Handler{"work": noop})
	eventually(t, "the taker holds bucket 9", func() bool { _, ok := taker.keeper.Holds(bk); return ok })
	// The giver forgets it once the hand-off's answer is back, which may
	// come a moment after the taker took the bucket up.
	eventually(t, "the giver's limiter forgets bucket 9", func() bool {
		giver.limits.mu.Lock()
		defer giver.limits.mu.Unlock()
		_, ready := giver.limits.ready[bk]
		_, acquired := giver.limits.acquired[bk]
		return !ready && !acquired
	})
	// The keeper holds the bucket a moment before it tells the limiter.
	eventually(t, "the taker's limiter starts bucket 9 as a takeover", func() bool {
		taker.limits.mu.Lock()
		defer taker.limits.mu.Unlock()
		_, acquired := taker.limits.acquired[bk]
		return acquired
	})
}

// TestANodeThatDoesNotBalanceTakesWhatItCan: NoBalance keeps the node as
// nodes were before balancing: it takes every free bucket it declares, and
// a balancing node that comes later gets nothing from it.
func TestANodeThatDoesNotBalanceTakesWhatItCan(t *testing.T) {
	b := setup(t)
	cfg := b.balancing(t, "old")
	cfg.NoBalance = true
	old := b.startNode(t, cfg, map[string]Handler{"work": noop})
	newer := b.startNode(t, b.balancing(t, "new"), map[string]Handler{"work": noop})
	passesOf(t, old, 3)
	passesOf(t, newer, 3)
	if got := len(old.Held()); got != testBuckets {
		t.Errorf("the node that does not balance holds %d buckets, want all %d", got, testBuckets)
	}
	if got := newer.Held(); len(got) != 0 {
		t.Errorf("the balancing node took %v from one that does not balance", got)
	}
}

// TestTheHandOffCauseReleasesLikeAShutdown: decide maps a hand-off's
// cancellation to a release, and a pausing task's to paused.
func TestTheHandOffCauseReleasesLikeAShutdown(t *testing.T) {
	n := &Node{id: "n"}
	a := &attempt{view: &task.Task{}, number: 2, max: 3}
	if tr := n.decide(a, context.Canceled, ErrHandingOff); tr.To != task.Queued || tr.Error != "" {
		t.Errorf("a handler cancelled for a hand-off: %+v, want queued with no error", tr)
	}
	if tr := n.decide(a, errors.New("boom"), ErrHandingOff); tr.To != task.Queued || tr.Error != "boom" {
		t.Errorf("a handler that failed after a hand-off's cancel: %+v, want queued, its error kept", tr)
	}
	a.pauseRequested.Store(true)
	if tr := n.decide(a, context.Canceled, ErrHandingOff); tr.To != task.Paused {
		t.Errorf("a pausing task cancelled for a hand-off: %+v, want paused", tr)
	}
}

// TestShutdownHandsOnABucketHandedToItAndNotTakenUp: a bucket handed to a
// node that has not taken it up yet (it has not renewed since) goes on to
// another node at its shutdown, rather than being released for nobody in
// particular.
func TestShutdownHandsOnABucketHandedToItAndNotTakenUp(t *testing.T) {
	b := setup(t)
	const bk = 9
	// A holder from outside the fleet keeps bucket 9 while the nodes start.
	outside, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "outside/1", Node: "outside",
		Buckets: bucket.Of(bk), TTL: time.Hour})
	if err != nil || !outside[0].Held {
		t.Fatalf("the outside holder's lease: %v, %v", outside, err)
	}
	// Neither node hears a notification, and neither renews during the
	// test: what the store holds is what their Start and Shutdown did.
	quiet := func(id string) *Node {
		cfg := b.config(t, id)
		cfg.BucketLeaseTTL, cfg.BucketLeaseHeartbeat = 3*time.Hour, time.Hour
		h := b.store.Handle()
		t.Cleanup(h.Close)
		n := newNodeOn(t, quietStore{h}, cfg, map[string]Handler{"work": noop})
		if err := n.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		return n
	}
	a := quiet("a")
	c := quiet("c")
	// Their passes after Start (the first, and one its plan asked for) are
	// over before the bucket is handed to c: from then on neither runs one.
	eventually(t, "a and c have made their first passes", func() bool {
		return a.leasePasses.Load() >= 2 && c.leasePasses.Load() >= 1
	})
	if _, err := b.store.HandOff(b.ctx, "outside/1", []store.Handoff{
		{Bucket: bk, Epoch: outside[0].Epoch, To: c.Incarnation(), ToNode: "c"}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, held := c.keeper.Holds(bk); held {
		t.Fatal("c took the bucket up: the test needs it not to have")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if l := b.lease(t, bk); l.Node != "a" || l.HandedBy != "c" {
		t.Errorf("after c's shutdown bucket %d is %+v, want handed on by c to a", bk, l)
	}
}

// TestAFreeBucketItsTargetDoesNotTakeIsTakenAfterAFewPasses: a bucket
// nobody holds whose target never takes it (a node registered but taking no
// lease) is taken, after freeGrace heartbeats, by another node that declares it.
func TestAFreeBucketItsTargetDoesNotTakeIsTakenAfterAFewPasses(t *testing.T) {
	b := setup(t)
	const bk = 9
	if err := b.store.RegisterNode(b.ctx, store.NodeInfo{ID: "absent", Incarnation: "absent/1", Buckets: bucket.Of(bk),
		Balance: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	a := b.startNode(t, b.balancing(t, "a"), map[string]Handler{"work": noop})
	if _, held := a.keeper.Holds(bk); held {
		t.Fatal("a took bucket 9 at once although the assignment gives it to absent")
	}
	// It takes it once it has seen it free for freeGrace heartbeats, and then
	// hands it to its target, which it may not hold (the test's absent
	// node takes nothing up).
	eventually(t, "a takes bucket 9 and hands it to absent", func() bool {
		l := b.lease(t, bk)
		return l.Node == "absent" && l.HandedBy == "a"
	})
}

// A hand-off counts its bucket's attempts only once every claim that could
// have named the bucket has registered them. A pass of the hand-off loop
// that runs meanwhile (woken by another attempt's end) must not give the
// bucket: a claim still in flight would start its tasks there after the
// move, their outcomes would be fenced, and the successor would run them
// again (seen in the elastic scenario on a loaded machine).
func TestAHandOffWaitsForTheClaimsInFlightBeforeCountingItsAttempts(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "giver", 5)
	// The hand-off below is the test's own: a balancing node, alone in its
	// fleet, would call it off at its next pass, as its assignment keeps
	// bucket 5 here.
	cfg.NoBalance = true
	n := b.startNode(t, cfg, map[string]Handler{"work": noop})
	if got := n.Held(); len(got) != 1 {
		t.Fatalf("the giver holds %v, want bucket 5", got)
	}
	n.claimMu.Lock() // a claim in flight
	locked := true
	defer func() {
		if locked {
			n.claimMu.Unlock()
		}
	}()
	begun := make(chan []int, 1)
	go func() {
		begun <- n.handoffs.begin(b.ctx, []handoffMove{{bucket: 5, to: "taker/1", toNode: "taker"}})
	}()
	eventually(t, "the hand-off is under way", func() bool { return len(n.handoffs.underWay()) == 1 })
	n.handoffs.pass(b.ctx)
	if l := b.lease(t, 5); l.Holder != n.incarnation {
		t.Fatalf("bucket 5 went to %q while a claim that may name it was in flight", l.Holder)
	}
	n.claimMu.Unlock()
	locked = false
	if got := <-begun; len(got) != 1 {
		t.Fatalf("begin answered %v", got)
	}
	eventually(t, "bucket 5 handed to its successor", func() bool { return b.lease(t, 5).Holder == "taker/1" })
}
