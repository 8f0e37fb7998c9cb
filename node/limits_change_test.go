package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The limits are data the fleet shares and may change at any time; a node
// re-reads them at each refresh (every bucket lease heartbeat). These tests
// change a limit while its tasks run or wait, and look at what starts
// after the node has read the change.

// changeConfig is a node that re-reads its limits every 50 ms.
func changeConfig(t *testing.T, b *testBundle, id string, lim store.Limit, buckets ...int) Config {
	cfg := b.config(t, id, buckets...)
	cfg.Limits = []store.Limit{lim}
	cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
	cfg.BucketLeaseTTL = time.Second
	return cfg
}

// readLimit reports whether n's limiter holds the limits of kind that ok
// accepts (none, when the limit was removed).
func readLimit(n *Node, kind string, ok func([]store.Limit) bool) func() bool {
	return func() bool {
		n.limits.mu.Lock()
		defer n.limits.mu.Unlock()
		return ok(n.limits.limits[kind])
	}
}

// concurrencyIs accepts one limit of concurrency c.
func concurrencyIs(c int) func([]store.Limit) bool {
	return func(ls []store.Limit) bool { return len(ls) == 1 && ls[0].Concurrency == c }
}

func setLimit(t *testing.T, b *testBundle, lim store.Limit) {
	t.Helper()
	if _, err := b.store.UpsertLimit(b.ctx, lim); err != nil {
		t.Fatal(err)
	}
}

// openGate returns what lets every gated task end, which also runs when
// the test ends: registered after the nodes' shutdown, it runs before it,
// and a failed test does not leave that shutdown waiting for handlers.
func openGate(t *testing.T, gate chan struct{}) func() {
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	return open
}

// endOne lets one gated task end.
func endOne(t *testing.T, gate chan<- struct{}) {
	t.Helper()
	select {
	case gate <- struct{}{}:
	case <-time.After(patience.Scale(15 * time.Second)):
		t.Fatal("timed out waiting for a running task to end")
	}
}

// releaseOneByOne ends running tasks one at a time (end) until total have
// started, each time waiting until the slot it frees is taken: the limit
// stays full, so a start beyond it would show in the peaks.
func releaseOneByOne(t *testing.T, started func() int, end func(), total int) {
	t.Helper()
	for s := started(); s < total; s++ {
		end()
		eventually(t, "the freed slot is taken", func() bool { return started() > s })
	}
}

// backlogThroughChange queues total tasks of limit key t on n, whose
// handler (led's, behind gate) holds each until released. It checks that
// exactly before of them start, calls change (which returns once n has read
// the change), checks that exactly after start, then releases them one at
// a time and checks that every task succeeds and the key ran at most after
// at once.
func backlogThroughChange(t *testing.T, b *testBundle, n *Node, led *ledger, gate chan struct{},
	total, before, after int, change func()) {
	t.Helper()
	open := openGate(t, gate)
	var ids []int64
	for i := range total {
		ids = append(ids, submit(t, n, SubmitRequest{Kind: "fetch", Key: fmt.Sprint(i), LimitKey: "t"}).ID)
	}
	startsExactly := func(want int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d running", want), func() bool { return led.started() >= want })
		claimPassesAfter(t, n)
		if got := led.started(); got != want {
			t.Fatalf("%d started where %d may run", got, want)
		}
	}
	startsExactly(before)
	change()
	startsExactly(after)
	releaseOneByOne(t, led.started, func() { endOne(t, gate) }, total)
	open()
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	if peaks, _ := led.peaks(); peaks["t"] != after {
		t.Errorf("key t ran at most %d at once after the change, want %d", peaks["t"], after)
	}
}

// TestLimitRaisedWhileTasksRun: a per-key concurrency limit raised from 1
// to 3 while one task of the key runs lets two more start at once, and no
// fourth. Guards the limiter's refresh replacing its limits and the claim's
// room of a key (concurrency minus running) under the new value.
func TestLimitRaisedWhileTasksRun(t *testing.T) {
	b := setup(t)
	led := newLedger()
	lim := store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 1}
	gate := make(chan struct{})
	n := b.startNode(t, changeConfig(t, b, "n1", lim), map[string]Handler{"fetch": led.handler(gate)})
	backlogThroughChange(t, b, n, led, gate, 10, 1, 3, func() {
		lim.Concurrency = 3
		setLimit(t, b, lim)
		eventually(t, "the node reads the new limit", readLimit(n, "fetch", concurrencyIs(3)))
	})
}

// TestLimitRemovedWhileTasksRun: once the node has read that the per-key
// limit is gone (worker limit rm), the key runs as many as the node's
// concurrency (5), and every task starts. Guards the refresh that drops a
// deleted limit (and with it the limits mode) instead of keeping the last
// one it read.
func TestLimitRemovedWhileTasksRun(t *testing.T) {
	b := setup(t)
	led := newLedger()
	lim := store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}
	cfg := changeConfig(t, b, "n1", lim)
	cfg.Concurrency = 5
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"fetch": led.handler(gate)})
	backlogThroughChange(t, b, n, led, gate, 12, 2, 5, func() {
		if err := b.store.DeleteLimit(b.ctx, "api"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the node reads that the limit is gone", readLimit(n, "fetch", func(ls []store.Limit) bool { return len(ls) == 0 }))
	})
}

// TestLimitRateChangedWhileTasksRun changes a per-key rate limit while the
// key has a backlog, and holds the starts after the node has read the
// change to the new rule: no window of one period holds more than rate +
// burst of them. Start times are the store's claim times, taken under the
// claim lock after the limiter decided and before it recorded the start,
// so that the bound holds by construction and not by the scheduling of
// handlers. Guards the refresh replacing the rate limit, and the claim's
// tokens under the new interval and burst (the key's GCRA state carried
// over from the old rule).
func TestLimitRateChangedWhileTasksRun(t *testing.T) {
	cases := []struct {
		name     string
		from, to store.Limit
		// before is the starts under the old rule before the change;
		// queued and more the tasks queued before it and after it.
		before, queued, more int
	}{
		// At the old rate the 19 starts after the first would take 19 s,
		// past the deadline of the wait for them all.
		{"faster",
			store.Limit{Rate: 1, Period: time.Second, Burst: 1},
			store.Limit{Rate: 2, Period: 100 * time.Millisecond, Burst: 1},
			1, 10, 10},
		// At the old rate the 7 tasks queued after the change (and what
		// is left of the backlog) would start within 400 ms: more than 6
		// in a second.
		{"slower",
			store.Limit{Rate: 20, Period: time.Second, Burst: 2},
			store.Limit{Rate: 5, Period: time.Second, Burst: 1},
			3, 6, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			led := newLedger()
			lim := c.from
			lim.Name, lim.Kind, lim.Per = "mail", "send", store.PerKey
			n := b.startNode(t, changeConfig(t, b, "n1", lim), map[string]Handler{"send": led.handler(nil)})
			var ids []int64
			for i := range c.queued {
				ids = append(ids, submit(t, n, SubmitRequest{Kind: "send", Key: fmt.Sprint(i), LimitKey: "k"}).ID)
			}
			eventually(t, "starts under the old rate", func() bool { return led.started() >= c.before })
			lim.Rate, lim.Period, lim.Burst = c.to.Rate, c.to.Period, c.to.Burst
			setLimit(t, b, lim)
			eventually(t, "the node reads the new rate", readLimit(n, "send", func(ls []store.Limit) bool {
				return len(ls) == 1 && ls[0].Rate == lim.Rate && ls[0].Period == lim.Period
			}))
			// Every claim pass in flight when the node read the change has
			// ended: whatever is claimed after this was decided under the
			// new rule.
			claimPassesAfter(t, n)
			cutoff := time.Now()
			// Tasks queued after the cutoff start after it: the check
			// below always has more starts than the new rule allows in a
			// period.
			for i := range c.more {
				ids = append(ids, submit(t, n, SubmitRequest{Kind: "send", Key: fmt.Sprint("more-", i), LimitKey: "k"}).ID)
			}
			total := c.queued + c.more
			eventually(t, "every task starts", func() bool { return led.started() == total })
			var after []time.Time
			for _, id := range ids {
				if s := b.get(t, id).StartedAt; s.After(cutoff) {
					after = append(after, s)
				}
			}
			if len(after) < c.more {
				t.Fatalf("%d starts after the change, want at least the %d tasks queued after it", len(after), c.more)
			}
			slices.SortFunc(after, time.Time.Compare)
			// The most starts in a window of one period.
			most, from := 0, 0
			for i := range after {
				in := 0
				for j := i; j < len(after) && after[j].Sub(after[i]) < lim.Period; j++ {
					in++
				}
				if in > most {
					most, from = in, i
				}
			}
			if limit := lim.Rate + lim.EffectiveBurst(); most > limit {
				t.Errorf("%d starts within %v from start %d of %d after the change to %v, want at most %d",
					most, lim.Period, from, len(after), lim, limit)
			}
		})
	}
}

// fleetRun is two nodes that split the buckets, each declaring a fleet-wide
// limit, and counts its kind's handlers running across the fleet and on
// each node, and the most that ran at once in the fleet. Each node's tasks
// wait at its own gate, so that a test chooses on which node one ends.
type fleetRun struct {
	nodes []*Node
	gates []chan struct{}
	ids   []int64

	mu      sync.Mutex
	now     int
	peak    int
	started int
	onNode  []int
}

// startFleet starts the two nodes and queues perNode tasks of lim's kind
// in each one's buckets.
func startFleet(t *testing.T, b *testBundle, lim store.Limit, perNode int) *fleetRun {
	t.Helper()
	// Made before the first node starts: its handlers read them at once.
	f := &fleetRun{gates: []chan struct{}{make(chan struct{}), make(chan struct{})}, onNode: make([]int, 2)}
	for i, bs := range [][]int{b.bucketRange(0, 32), b.bucketRange(32, 64)} {
		n := b.startNode(t, changeConfig(t, b, fmt.Sprint("n", i), lim, bs...), map[string]Handler{lim.Kind: f.handler(i)})
		f.nodes = append(f.nodes, n)
		for _, key := range b.keysIn(bucket.Of(bs...), perNode) {
			f.ids = append(f.ids, submit(t, n, SubmitRequest{Kind: lim.Kind, Key: key}).ID)
		}
	}
	return f
}

func (f *fleetRun) handler(i int) Handler {
	return func(ctx context.Context, _ *task.Task) error {
		f.mu.Lock()
		f.now++
		f.onNode[i]++
		f.started++
		f.peak = max(f.peak, f.now)
		f.mu.Unlock()
		select {
		case <-f.gates[i]:
		case <-ctx.Done():
		}
		f.mu.Lock()
		f.now--
		f.onNode[i]--
		f.mu.Unlock()
		return nil
	}
}

func (f *fleetRun) running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fleetRun) startedNow() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func (f *fleetRun) peakNow() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peak
}

// resetPeak makes the peak what runs now.
func (f *fleetRun) resetPeak() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peak = f.now
}

// endOne lets one task end on the node that runs the fewest: nodes drain
// one after the other, and the one left with nothing running must not use
// the room the other's tasks still hold.
func (f *fleetRun) endOne(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	pick := -1
	for i, n := range f.onNode {
		if n > 0 && (pick < 0 || n < f.onNode[pick]) {
			pick = i
		}
	}
	f.mu.Unlock()
	if pick < 0 {
		t.Fatal("no task runs to end")
	}
	endOne(t, f.gates[pick])
}

// claimPasses waits for two more claim passes of each node.
func (f *fleetRun) claimPasses(t *testing.T) {
	t.Helper()
	for _, n := range f.nodes {
		claimPassesAfter(t, n)
	}
}

// openGates returns what lets every task end, as openGate.
func (f *fleetRun) openGates(t *testing.T) func() {
	var opens []func()
	for _, g := range f.gates {
		opens = append(opens, openGate(t, g))
	}
	return func() {
		for _, open := range opens {
			open()
		}
	}
}

// sharedUnder waits until each node has read the limit's new concurrency
// and taken its share since the change was written (before at): the store
// grants a share under the limit it reads at that take, and a share
// granted before may be spent until it is taken again.
func sharedUnder(t *testing.T, nodes []*Node, lim store.Limit, at time.Time) {
	t.Helper()
	for _, n := range nodes {
		eventually(t, "the node reads the new limit", readLimit(n, lim.Kind, concurrencyIs(lim.Concurrency)))
		eventually(t, "the node takes its share under it", func() bool {
			l := n.limits
			l.mu.Lock()
			defer l.mu.Unlock()
			// deadline is the take's send time + TTL - margin.
			return l.shares[lim.Name].deadline.After(at.Add(l.ttl - l.margin))
		})
	}
}

// startsExactly waits until want tasks have started across the fleet, and
// checks that the claims after that started no more.
func (f *fleetRun) startsExactly(t *testing.T, want int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d running", want), func() bool { return f.startedNow() >= want })
	f.claimPasses(t)
	if got := f.startedNow(); got != want {
		t.Fatalf("%d started where the fleet may run %d", got, want)
	}
}

// drain releases the running tasks one at a time until every task has
// started, lets them all end (open), and checks that they all succeed and
// the fleet ran at most peak at once.
func (f *fleetRun) drain(t *testing.T, b *testBundle, open func(), peak int) {
	t.Helper()
	releaseOneByOne(t, f.startedNow, func() { f.endOne(t) }, len(f.ids))
	open()
	for _, id := range f.ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	if got := f.peakNow(); got != peak {
		t.Errorf("the fleet ran at most %d at once after the change, want %d", got, peak)
	}
}

// TestLimitFleetLoweredWhileTasksRun: a fleet-wide limit lowered from 4 to
// 2 while 4 run on two nodes starts nothing more until fewer than 2 run,
// and from then on the fleet runs at most 2 at once; every task starts.
// Tasks end first on the node that runs the fewest, so that a node with
// nothing running while the other still runs 2 must start nothing. Guards
// the grant under the limit's new concurrency (TakeShare counting each
// other holder at the larger of its share and its running tasks), and the
// claim's room of the kind (share minus running).
func TestLimitFleetLoweredWhileTasksRun(t *testing.T) {
	b := setup(t)
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4}
	f := startFleet(t, b, lim, 6)
	open := f.openGates(t)
	f.startsExactly(t, 4)
	lim.Concurrency = 2
	setLimit(t, b, lim)
	sharedUnder(t, f.nodes, lim, time.Now())
	// Two of the four end: the two left are the new limit, so nothing
	// starts in their place.
	for range 2 {
		f.endOne(t)
	}
	eventually(t, "two running", func() bool { return f.running() <= 2 || f.startedNow() > 4 })
	// Shares taken since then, and claims under them.
	sharedUnder(t, f.nodes, lim, time.Now())
	f.claimPasses(t)
	if got := f.startedNow(); got != 4 {
		t.Fatalf("%d started while 2 ran under a fleet-wide limit lowered to 2", got)
	}
	f.resetPeak()
	f.drain(t, b, open, 2)
}

// TestLimitFleetRaisedWhileTasksRun: a fleet-wide limit raised from 2 to 4
// while 2 run on two nodes lets the fleet run 4 at once, and never more.
// Guards the same grant and room as the lowered case, and the renewal of
// shares that hands out the new room.
func TestLimitFleetRaisedWhileTasksRun(t *testing.T) {
	b := setup(t)
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 2}
	f := startFleet(t, b, lim, 6)
	open := f.openGates(t)
	f.startsExactly(t, 2)
	lim.Concurrency = 4
	setLimit(t, b, lim)
	sharedUnder(t, f.nodes, lim, time.Now())
	f.startsExactly(t, 4)
	f.drain(t, b, open, 4)
}
