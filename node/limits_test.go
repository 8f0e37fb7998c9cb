package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// ledger records, per limit key, how many handlers run at once and the
// most that ever did.
type ledger struct {
	mu       sync.Mutex
	running  map[string]int
	peak     map[string]int
	kindPeak int
	kindNow  int
	starts   []time.Time
	order    []string
}

func newLedger() *ledger { return &ledger{running: map[string]int{}, peak: map[string]int{}} }

func (l *ledger) handler(release <-chan struct{}) Handler {
	return func(ctx context.Context, t *task.Task) error {
		k := store.LimitKeyOf(t.Key, t.LimitKey)
		l.mu.Lock()
		l.running[k]++
		l.kindNow++
		l.peak[k] = max(l.peak[k], l.running[k])
		l.kindPeak = max(l.kindPeak, l.kindNow)
		l.starts = append(l.starts, time.Now())
		l.order = append(l.order, k)
		l.mu.Unlock()
		if release != nil {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		l.mu.Lock()
		l.running[k]--
		l.kindNow--
		l.mu.Unlock()
		return nil
	}
}

func (l *ledger) peaks() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.peak {
		out[k] = v
	}
	return out, l.kindPeak
}

func (l *ledger) started() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.starts)
}

func TestLimitConcurrencyPerKey(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Concurrency = 50
	cfg.Limits = []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}}
	release := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"fetch": led.handler(release)})
	var ids []int64
	for i := range 30 {
		tk := submit(t, n, SubmitRequest{Kind: "fetch", Key: fmt.Sprintf("order-%d", i), LimitKey: fmt.Sprintf("tenant-%d", i%3)})
		ids = append(ids, tk.ID)
	}
	// 3 keys × 2: six start, and no more while they run.
	eventually(t, "six running", func() bool { return led.started() == 6 })
	claimPassesAfter(t, n)
	if got := led.started(); got != 6 {
		t.Fatalf("%d started while six held every key's 2 slots", got)
	}
	close(release)
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	peaks, _ := led.peaks()
	for k, p := range peaks {
		if p > 2 {
			t.Errorf("key %s ran %d at once, limit 2", k, p)
		}
	}
}

func TestLimitChangedWhileTasksRun(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Limits = []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 3}}
	cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
	cfg.BucketLeaseTTL = time.Second
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"fetch": led.handler(gate)})
	for i := range 10 {
		submit(t, n, SubmitRequest{Kind: "fetch", Key: fmt.Sprint(i), LimitKey: "t"})
	}
	eventually(t, "three running", func() bool { return led.started() == 3 })
	// Lowered to 1 while 3 run: nothing more starts until fewer than 1 run.
	if _, err := b.store.UpsertLimit(b.ctx, store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the node reads the new limit", func() bool {
		n.limits.mu.Lock()
		defer n.limits.mu.Unlock()
		return len(n.limits.limits["fetch"]) == 1 && n.limits.limits["fetch"][0].Concurrency == 1
	})
	led.mu.Lock()
	led.peak = map[string]int{}
	led.mu.Unlock()
	for range 3 {
		gate <- struct{}{}
	}
	eventually(t, "a fourth starts", func() bool { return led.started() >= 4 })
	close(gate)
	eventually(t, "all ten start", func() bool { return led.started() == 10 })
	if peaks, _ := led.peaks(); peaks["t"] > 1 {
		t.Errorf("after the limit went down to 1, %d ran at once", peaks["t"])
	}
}

func TestLimitRatePerKey(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Limits = []store.Limit{{Name: "mail", Kind: "send", Per: store.PerKey, Rate: 5, Period: time.Second, Burst: 2}}
	n := b.startNode(t, cfg, map[string]Handler{"send": led.handler(nil)})
	var ids []int64
	for i := range 8 {
		ids = append(ids, submit(t, n, SubmitRequest{Kind: "send", Key: fmt.Sprint(i), LimitKey: "k"}).ID)
	}
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	// 5/s with a burst of 2, from a bucket just taken (no tokens): the
	// eighth start is at least 7 intervals of 200ms after the first.
	led.mu.Lock()
	defer led.mu.Unlock()
	if d := led.starts[7].Sub(led.starts[0]); d < 7*200*time.Millisecond-50*time.Millisecond {
		t.Errorf("8 starts over %v, want at least 1.35s at 5/s", d)
	}
	for i := range led.starts {
		// No window of one period holds more than rate + burst starts.
		n := 0
		for j := i; j < len(led.starts) && led.starts[j].Sub(led.starts[i]) < time.Second; j++ {
			n++
		}
		if n > 7 {
			t.Errorf("%d starts within a second from start %d", n, i)
		}
	}
}

func TestLimitResourcesPerNode(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Capacity = store.Resources{"gpu": 2}
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"train": led.handler(gate)})
	for i := range 5 {
		submit(t, n, SubmitRequest{Kind: "train", Key: fmt.Sprint(i), Resources: store.Resources{"gpu": 1}})
	}
	big := submit(t, n, SubmitRequest{Kind: "train", Key: "big", Resources: store.Resources{"gpu": 3}})
	eventually(t, "two running", func() bool { return led.started() == 2 })
	claimPassesAfter(t, n)
	if got := led.started(); got != 2 {
		t.Fatalf("%d started on 2 gpus, each needing 1", got)
	}
	close(gate)
	eventually(t, "five run", func() bool { return led.started() == 5 })
	claimPassesAfter(t, n)
	if got := b.get(t, big.ID); got.Status != task.Queued {
		t.Errorf("a task needing 3 gpus on a node with 2 is %s", got.Status)
	}
}

// A node that declares no capacity and no limit uses the plain claim, which
// must leave a task that needs resources to a node that has them.
func TestLimitNodeWithoutCapacityLeavesTasksThatNeedResources(t *testing.T) {
	b := setup(t)
	led := newLedger()
	n := b.startNode(t, b.config(t, "n1"), map[string]Handler{"train": led.handler(nil)})
	gpu := submit(t, n, SubmitRequest{Kind: "train", Key: "gpu", Resources: store.Resources{"gpu": 1}})
	submit(t, n, SubmitRequest{Kind: "train", Key: "plain"})
	eventually(t, "the plain task runs", func() bool { return led.started() == 1 })
	claimPassesAfter(t, n)
	if got := led.started(); got != 1 {
		t.Fatalf("%d started, want only the task that needs nothing", got)
	}
	if got := b.get(t, gpu.ID); got.Status != task.Queued {
		t.Errorf("a task needing a gpu on a node without capacity is %s", got.Status)
	}
}

func TestLimitFleetShareAcrossNodes(t *testing.T) {
	b := setup(t)
	led := newLedger()
	gate := make(chan struct{})
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4}
	var nodes []*Node
	for i, bs := range [][]int{b.bucketRange(0, 32), b.bucketRange(32, 64)} {
		cfg := b.config(t, fmt.Sprintf("n%d", i), bs...)
		cfg.Limits = []store.Limit{lim}
		cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
		cfg.BucketLeaseTTL = time.Second
		nodes = append(nodes, b.startNode(t, cfg, map[string]Handler{"train": led.handler(gate)}))
	}
	var ids []int64
	for i := range 40 {
		req := SubmitRequest{Kind: "train", Key: fmt.Sprint(i)}
		for _, n := range nodes {
			if tk, err := n.Submit(b.ctx, req); err == nil {
				ids = append(ids, tk.ID)
				break
			}
		}
	}
	eventually(t, "four running", func() bool { return led.started() == 4 })
	for range 30 {
		gate <- struct{}{}
	}
	close(gate)
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	if _, peak := led.peaks(); peak > 4 {
		t.Errorf("%d ran at once across the fleet, limit 4", peak)
	}
}

func TestLimitFairnessAcrossKeys(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.Concurrency = 10
	cfg.Limits = []store.Limit{{Name: "per-key", Kind: "job", Per: store.PerKey, Concurrency: 10}}
	n := b.newNode(t, cfg, map[string]Handler{"job": led.handler(nil)})
	// The big key's 2,000 tasks are older than the small keys' 200.
	var reqs []SubmitRequest
	for i := range 2000 {
		reqs = append(reqs, SubmitRequest{Kind: "job", Key: fmt.Sprint("big-", i), LimitKey: "big"})
	}
	for k := range 20 {
		for i := range 10 {
			reqs = append(reqs, SubmitRequest{Kind: "job", Key: fmt.Sprint(k, "-", i), LimitKey: fmt.Sprint("small-", k)})
		}
	}
	for i := 0; i < len(reqs); i += 500 {
		if _, err := n.SubmitMany(b.ctx, reqs[i:min(i+500, len(reqs))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every task starts", func() bool { return led.started() == 2200 })
	led.mu.Lock()
	defer led.mu.Unlock()
	bigBefore, small := 0, 0
	for _, k := range led.order {
		if k == "big" {
			bigBefore++
		} else {
			small++
			if small == 200 {
				break
			}
		}
	}
	// The claim's second walk and its least-used-first order bring the
	// small keys forward; this bound is what they reach today (a half),
	// not yet the tenth a per-key walk would give.
	if bigBefore > 1000 {
		t.Errorf("the big key started %d tasks before the last small key's task started; want at most half of 2,000", bigBefore)
	}
}

// bucketRange is the buckets lo to hi-1.
func (b *testBundle) bucketRange(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}
