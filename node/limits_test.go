package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/store/postgres"
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

// TestLimitFairnessAcrossKeys is the fairness case: one key with
// 20,000 queued tasks, older than those of 20 keys with 10 each, on a node
// of 10 slots with a per-key limit of 10. Every small key's tasks must all
// have started before the big key has started a tenth of its tasks (2,000),
// read from the order in which handlers start. It runs on the memory store
// and on PostgreSQL; SQLite's claim decides with the memory store's code
// (store.LimitView), and its second walk passes over the big key's backlog
// row by row, which under the race detector takes the pure-Go SQLite
// seconds per claim: the contract suite covers its order.
func TestLimitFairnessAcrossKeys(t *testing.T) {
	stores := []struct {
		name string
		big  int
		open func(t *testing.T, b *testBundle) store.Store
	}{
		{"memory", 20_000, func(t *testing.T, b *testBundle) store.Store {
			h := b.store.Handle()
			t.Cleanup(h.Close)
			return h
		}},
		{"postgres", 20_000, func(t *testing.T, b *testBundle) store.Store {
			s, err := postgres.New(b.ctx, testdb.New(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if _, err := s.Migrate(b.ctx, testBuckets); err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
	const smallKeys, perSmall = 20, 10
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			big := st.big
			b := setup(t)
			led := newLedger()
			cfg := b.config(t, "n1")
			cfg.Logger = zap.NewNop()
			cfg.Concurrency = 10
			cfg.Limits = []store.Limit{{Name: "per-key", Kind: "job", Per: store.PerKey, Concurrency: 10}}
			n := newNodeOn(t, st.open(t, b), cfg, map[string]Handler{"job": led.handler(nil)})
			// The big key's tasks are older than the small keys'.
			var reqs []SubmitRequest
			for i := range big {
				reqs = append(reqs, SubmitRequest{Kind: "job", Key: fmt.Sprint("big-", i), LimitKey: "big"})
			}
			for k := range smallKeys {
				for i := range perSmall {
					reqs = append(reqs, SubmitRequest{Kind: "job", Key: fmt.Sprint(k, "-", i), LimitKey: fmt.Sprint("small-", k)})
				}
			}
			for i := 0; i < len(reqs); i += 1000 {
				if _, err := n.SubmitMany(b.ctx, reqs[i:min(i+1000, len(reqs))]); err != nil {
					t.Fatal(err)
				}
			}
			if err := n.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			// Wait until every small task or a tenth of the big key has
			// started, whichever comes first.
			bigStarted := func() (bigBefore, small int) {
				led.mu.Lock()
				defer led.mu.Unlock()
				for _, k := range led.order {
					if k == "big" {
						bigBefore++
					} else if small++; small == smallKeys*perSmall {
						break
					}
				}
				return bigBefore, small
			}
			deadline := time.Now().Add(patience.Scale(5 * time.Minute))
			for {
				bigBefore, small := bigStarted()
				if small == smallKeys*perSmall || bigBefore >= big/10 {
					if bigBefore >= big/10 {
						t.Fatalf("the big key started %d tasks while %d of the small keys' %d had started; want all of them before %d",
							bigBefore, small, smallKeys*perSmall, big/10)
					}
					t.Logf("the big key started %d tasks before the last small key's task", bigBefore)
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("timed out: %d small tasks and %d of the big key started", small, bigBefore)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
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

// TestLimitNoneDeclaredTakesNoLock holds the limiter's mutex for the whole
// run of a node in a fleet with no limits: tasks must still be claimed,
// run and settled, because without limits neither a claim pass nor a
// settled attempt takes that lock.
func TestLimitNoneDeclaredTakesNoLock(t *testing.T) {
	b := setup(t)
	led := newLedger()
	n := b.startNode(t, b.config(t, "n1"), map[string]Handler{"job": led.handler(nil)})
	if n.limits.active() {
		t.Fatal("limits are active with none declared and no capacity")
	}
	n.limits.mu.Lock()
	locked := true
	defer func() {
		if locked {
			n.limits.mu.Unlock()
		}
	}()
	var ids []int64
	for i := range 20 {
		ids = append(ids, submit(t, n, SubmitRequest{Kind: "job", Key: fmt.Sprint(i)}).ID)
	}
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	locked = false
	n.limits.mu.Unlock()
}

// TestLimitNotReadYetClaimsNothing: until the limits have been read once
// the node claims through the limiter, which has no bucket ready, so a
// node whose first reading of the limits failed does not claim as if there
// were none.
func TestLimitNotReadYetClaimsNothing(t *testing.T) {
	b := setup(t)
	l := newLimiter(b.store, "o", "n1", nil, 10, time.Minute, time.Now, zap.NewNop())
	if !l.active() {
		t.Fatal("a limiter that has not read the limits lets claims through unlimited")
	}
	ready, _ := l.claim([]store.HeldBucket{{Bucket: 1, Epoch: 1}}, nil)
	if len(ready) != 0 {
		t.Errorf("buckets %v ready before any refresh", ready)
	}
	l.refresh(b.ctx, []store.HeldBucket{{Bucket: 1, Epoch: 1}}, []string{"job"})
	if l.active() {
		t.Error("still limited after reading no limits")
	}
}

// limitReports is a Metrics that also follows the limits.
type limitReports struct {
	nopMetrics
	mu   sync.Mutex
	last []LimitUse
	sum  map[string]int // closures by limit
}

func (r *limitReports) LimitsRefreshed(uses []LimitUse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = uses
	for _, u := range uses {
		r.sum[u.Limit] += u.Closures
	}
}

// reported is the use the last refresh reported.
func (r *limitReports) reported() []LimitUse {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *limitReports) closures(limit string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sum[limit]
}

// TestLimitUseIsReportedAtEachRefresh: a key at its concurrency limit is
// closed, counted once as a closure however many refreshes see it closed,
// and reported with the tasks running, to LimitUse and to a Metrics that
// follows limits.
func TestLimitUseIsReportedAtEachRefresh(t *testing.T) {
	b := setup(t)
	led := newLedger()
	reports := &limitReports{sum: map[string]int{}}
	cfg := b.config(t, "n1")
	cfg.Metrics = reports
	cfg.Limits = []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}}
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"fetch": led.handler(gate)})
	for i := range 3 {
		submit(t, n, SubmitRequest{Kind: "fetch", Key: fmt.Sprint(i), LimitKey: "t"})
	}
	submit(t, n, SubmitRequest{Kind: "fetch", Key: "other"})
	eventually(t, "three running", func() bool { return led.started() == 3 })
	for range 3 {
		n.limitPass(b.ctx)
	}
	want := []LimitUse{{Limit: "api", Kind: "fetch", Per: store.PerKey, Running: 3, ClosedKeys: 1}}
	if got := n.LimitUse(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("LimitUse() = %+v, want %+v", got, want)
	}
	if got := reports.closures("api"); got != 1 {
		t.Errorf("%d closures of key t reported, want 1", got)
	}
	close(gate)
	eventually(t, "all four start", func() bool { return led.started() == 4 })
}

// TestLimitRateStateOfIdleKeysIsPruned: a key's rate state is kept while
// its last start's due time is less than a period ago, and dropped after;
// a key dropped is not given more starts than it had.
func TestLimitRateStateOfIdleKeysIsPruned(t *testing.T) {
	b := setup(t, withManualClock())
	lim := store.Limit{Name: "mail", Kind: "send", Per: store.PerKey, Rate: 1, Period: time.Second, Burst: 1}
	if _, err := b.store.UpsertLimit(b.ctx, lim); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(b.store, "o", "n1", nil, 10, time.Minute, b.manual.Now, zap.NewNop())
	held := []store.HeldBucket{{Bucket: 1, Epoch: 1}}
	l.refresh(b.ctx, held, []string{"send"})
	l.hold([]*task.Task{{ID: 1, Kind: "send", Key: "k", Bucket: 1}})
	tatOf := func() (time.Time, bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		tat, ok := l.tat[rateKey{"mail", "k"}]
		return tat, ok
	}
	kept, ok := tatOf()
	if !ok {
		t.Fatal("no rate state after a start")
	}
	b.manual.Advance(kept.Sub(b.manual.Now()) + time.Second/2)
	l.refresh(b.ctx, held, []string{"send"})
	if _, ok := tatOf(); !ok {
		t.Fatal("the rate state was dropped half a period after its due time")
	}
	_, lc := l.claim(held, nil)
	room, _ := lc.View().Room("send", "k")
	b.manual.Advance(time.Second)
	l.refresh(b.ctx, held, []string{"send"})
	if _, ok := tatOf(); ok {
		t.Fatal("the rate state of a key idle for more than a period is kept")
	}
	_, lc = l.claim(held, nil)
	if after, _ := lc.View().Room("send", "k"); after > room {
		t.Errorf("the key has room %d once its state is dropped, %d before", after, room)
	}
}

// TestLimitFleetShareMovesBetweenHeartbeats: a holder that took the whole
// fleet-wide limit before another holder wanted any gives part of it back
// within shareRenewal, not at its next heartbeat: with heartbeats of 30 s,
// the second holder starts tasks well within the 15 s the test waits.
func TestLimitFleetShareMovesBetweenHeartbeats(t *testing.T) {
	b := setup(t)
	lim := store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4}
	if _, err := b.store.UpsertLimit(b.ctx, lim); err != nil {
		t.Fatal(err)
	}
	config := func(id string, buckets []int) Config {
		cfg := b.config(t, id, buckets...)
		cfg.BucketLeaseHeartbeat = 30 * time.Second
		cfg.BucketLeaseTTL = 90 * time.Second
		return cfg
	}
	first, second := b.bucketRange(0, 32), b.bucketRange(32, 64)
	release := make(chan struct{})
	defer close(release)
	firstLed, secondLed := newLedger(), newLedger()
	// Queued before the first holder starts: its first take, at its
	// buckets' acquisition, sees them and takes the whole limit.
	for _, key := range b.keysIn(bucket.Of(first...), 40) {
		if _, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "train", Key: key, Bucket: b.policy.Of(key)}}); err != nil {
			t.Fatal(err)
		}
	}
	b.startNode(t, config("a", first), map[string]Handler{"train": firstLed.handler(release)})
	eventually(t, "the first holder runs the whole limit", func() bool { return firstLed.started() == 4 })
	bn := b.startNode(t, config("b", second), map[string]Handler{"train": secondLed.handler(nil)})
	for _, key := range b.keysIn(bucket.Of(second...), 4) {
		if _, err := bn.Submit(b.ctx, SubmitRequest{Kind: "train", Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	// The first holder's tasks end one by one; with its share renewed
	// only at heartbeats it would keep all 4 and start its own next ones.
	// Not stretched for a loaded machine: past the heartbeat of 30 s, the
	// wait could no longer tell the two apart.
	deadline := time.Now().Add(15 * time.Second)
	for secondLed.started() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second holder started nothing: the first kept the whole limit until its heartbeat")
		}
		select {
		case release <- struct{}{}:
		case <-time.After(time.Millisecond):
		}
	}
	if _, peak := firstLed.peaks(); peak > 4 {
		t.Errorf("the first holder ran %d at once, limit 4", peak)
	}
}

// shareGateStore answers TakeShare with the share the test sets, and runs
// the test's during function while the take is in flight; ClaimLimited
// records the room each claim gave the kind (the claim's size where the
// room does not bind it) and takes nothing.
type shareGateStore struct {
	*memory.Store
	mu     sync.Mutex
	grant  int
	during func()
	rooms  []int
}

func (s *shareGateStore) TakeShare(ctx context.Context, req store.ShareRequest) (store.Share, error) {
	sh, err := s.Store.TakeShare(ctx, req)
	s.mu.Lock()
	sh.Share = s.grant
	during := s.during
	s.mu.Unlock()
	if during != nil {
		during()
	}
	return sh, err
}

func (s *shareGateStore) ClaimLimited(_ context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kr := range lc.Kinds {
		room := kr.Room
		if room < 0 || room > req.Limit {
			room = req.Limit
		}
		s.rooms = append(s.rooms, room)
	}
	return nil, nil
}

// TestLimitClaimWaitsForAShareTakeInFlight: a claim that starts while the
// holder takes its share again is decided under the share the take grants,
// not the one before it. A claim under the old share that committed after
// a take shrinking it could run tasks another holder was granted room for.
func TestLimitClaimWaitsForAShareTakeInFlight(t *testing.T) {
	b := setup(t)
	if _, err := b.store.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet,
		Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	s := &shareGateStore{Store: b.store, grant: 4}
	n := newNodeOn(t, s, b.config(t, "n1"), map[string]Handler{"train": func(context.Context, *task.Task) error { return nil }})
	n.kinds = []string{"train"}
	held := []store.HeldBucket{{Bucket: 1, Epoch: 1}}
	n.limits.refresh(b.ctx, held, n.kinds) // share 4, bucket 1 ready
	req := store.ClaimRequest{Owner: n.incarnation, Node: n.id, Buckets: held, Kinds: n.kinds, Limit: 10,
		LeaseTTL: time.Minute}
	claimed := make(chan struct{})
	s.mu.Lock()
	s.grant = 1
	s.during = func() {
		// Started while the take is in flight, the claim may not run
		// before the take has returned. It is given up to 200 ms to run
		// (which it does at once without the gate), then the take returns.
		go func() {
			defer close(claimed)
			if _, err := n.claimLimited(b.ctx, req, held); err != nil {
				t.Error(err)
			}
		}()
		select {
		case <-claimed:
		case <-time.After(200 * time.Millisecond):
		}
	}
	s.mu.Unlock()
	n.limits.takeShare(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet, Concurrency: 4},
		[]int{1})
	<-claimed
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rooms) != 1 || s.rooms[0] != 1 {
		t.Errorf("the claim gave the kind rooms %v, want [1]: the share the take in flight granted", s.rooms)
	}
}

// TestLimitFleetShareIsAskedForOnceSpent: a holder whose last take found
// no demand holds no share; when tasks arrive, the claim that finds the
// kind without room has the share taken again within shareRenewal, not at
// the next heartbeat (30 s here, past the 15 s the test waits).
func TestLimitFleetShareIsAskedForOnceSpent(t *testing.T) {
	b := setup(t)
	if _, err := b.store.UpsertLimit(b.ctx, store.Limit{Name: "train", Kind: "train", Per: store.PerFleet,
		Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "n1")
	cfg.BucketLeaseHeartbeat = 30 * time.Second
	cfg.BucketLeaseTTL = 90 * time.Second
	led := newLedger()
	n := b.startNode(t, cfg, map[string]Handler{"train": led.handler(nil)})
	eventually(t, "the first take, with no demand", func() bool {
		shares, err := b.store.ListShares(b.ctx)
		return err == nil && len(shares) == 1 && shares[0].Share == 0
	})
	if _, err := n.Submit(b.ctx, SubmitRequest{Kind: "train", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task starts before the heartbeat", func() bool { return led.started() == 1 })
}

// claimAlongStore counts the tasks claimed along with an outcome write.
type claimAlongStore struct {
	store.Store
	along atomic.Int64
}

func (s *claimAlongStore) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	out, claimed, err := s.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
	s.along.Add(int64(len(claimed)))
	return out, claimed, err
}

// claimLoopIdle reports whether no claim pass holds the claim lock or is
// asked for.
func claimLoopIdle(n *Node) bool {
	if len(n.claimLoop.wake) > 0 || !n.claimMu.TryLock() {
		return false
	}
	n.claimMu.Unlock()
	return len(n.claimLoop.wake) == 0
}

// fleetLimitConfig is a node with kind job limited to n running in the
// fleet, whose claims come only from pokes: no poll, no heartbeat while a
// test runs.
func fleetLimitConfig(t *testing.T, b *testBundle, n int) Config {
	cfg := b.config(t, "n1")
	cfg.Concurrency = 10
	cfg.PollInterval = time.Hour
	cfg.BucketLeaseHeartbeat = 30 * time.Second
	cfg.BucketLeaseTTL = 90 * time.Second
	cfg.Limits = []store.Limit{{Name: "jobs", Kind: "job", Per: store.PerFleet, Concurrency: n}}
	return cfg
}

// TestLimitSlotIsClaimedAlongWithItsOutcome: under a fleet-wide limit, the
// slot a task frees is claimed for the next in the transaction that writes
// its outcome (flushAndClaim), not by a claim pass after it. Under per-key
// limits alone the outcome is written alone and the claim pass claims: a
// key's slot is not shared with other nodes, and claims along with the
// writes cost the burn-down over many keys more database time than they
// save.
func TestLimitSlotIsClaimedAlongWithItsOutcome(t *testing.T) {
	perKey := func(t *testing.T, b *testBundle) Config {
		cfg := fleetLimitConfig(t, b, 1)
		cfg.Limits = []store.Limit{{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1}}
		return cfg
	}
	fleet := func(t *testing.T, b *testBundle) Config { return fleetLimitConfig(t, b, 1) }
	t.Run("fleet", func(t *testing.T) { testClaimAlong(t, fleet, 2) })
	t.Run("per_key", func(t *testing.T) { testClaimAlong(t, perKey, 0) })
}

// testClaimAlong runs three tasks of one limit key, limited to one running,
// and wants along of them claimed with an outcome write.
func testClaimAlong(t *testing.T, config func(*testing.T, *testBundle) Config, along int64) {
	b := setup(t)
	cfg := config(t, b)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &claimAlongStore{Store: h}
	release := make(chan struct{})
	led := newLedger()
	n := newNodeOn(t, s, cfg, map[string]Handler{"job": led.handler(release)})
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 3 {
		ids = append(ids, submit(t, n, SubmitRequest{Kind: "job", Key: fmt.Sprint("order-", i), LimitKey: "tenant"}).ID)
	}
	// One at a time, each task ends once no claim pass is in flight or
	// asked for, so that its outcome write finds the claim lock free.
	for i := range 3 {
		eventually(t, "the next starts", func() bool { return led.started() == i+1 })
		eventually(t, "the claim loop idle", func() bool { return claimLoopIdle(n) })
		release <- struct{}{}
	}
	for _, id := range ids {
		eventually(t, "all succeed", b.statusIs(t, id, task.Succeeded))
	}
	if got := s.along.Load(); got != along {
		t.Errorf("%d tasks were claimed along with an outcome write; want %d", got, along)
	}
	if peaks, _ := led.peaks(); peaks["tenant"] > 1 {
		t.Errorf("key tenant ran %d at once, limit 1", peaks["tenant"])
	}
}

// passGatedStore holds a limited claim pass at its gate, once armed, and
// counts the writes with a claim that ran while a pass was held.
type passGatedStore struct {
	*memory.Store
	armed      atomic.Bool
	held       atomic.Bool
	entered    chan struct{}
	gate       chan struct{}
	overlapped atomic.Int64
}

func (s *passGatedStore) ClaimLimited(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.held.Store(true)
		s.entered <- struct{}{}
		select {
		case <-s.gate:
		case <-ctx.Done(): // the claim's own deadline: a failed test still ends
		}
		s.held.Store(false)
	}
	return s.Store.ClaimLimited(ctx, req, lc)
}

func (s *passGatedStore) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	if s.held.Load() {
		s.overlapped.Add(1)
	}
	return s.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
}

// TestLimitOutcomeWriteGoesBesideAClaimPassInFlight forces the interleaving
// of a claim pass and an outcome write: while a pass's limited claim is in
// flight, an attempt ends. Its outcome is written at once, beside the
// pass, and without a claim: two claims at once would both count the same
// free slots, and waiting for the pass would put the write behind it.
func TestLimitOutcomeWriteGoesBesideAClaimPassInFlight(t *testing.T) {
	b := setup(t)
	cfg := fleetLimitConfig(t, b, 2)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &passGatedStore{Store: h, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	var opened sync.Once
	open := func() { opened.Do(func() { close(s.gate) }) }
	t.Cleanup(open)
	release := make(chan struct{})
	led := newLedger()
	n := newNodeOn(t, s, cfg, map[string]Handler{"job": led.handler(release)})
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	first := submit(t, n, SubmitRequest{Kind: "job", Key: "first", LimitKey: "a"})
	eventually(t, "the first starts", func() bool { return led.started() == 1 })
	eventually(t, "the claim loop idle", func() bool { return claimLoopIdle(n) })
	s.armed.Store(true)
	second := submit(t, n, SubmitRequest{Kind: "job", Key: "second", LimitKey: "b"})
	receive(t, s.entered, "the pass's limited claim in flight")
	release <- struct{}{} // the first ends while the pass is held
	eventually(t, "the first's outcome written while the pass is held", b.statusIs(t, first.ID, task.Succeeded))
	if got := s.overlapped.Load(); got != 0 {
		t.Errorf("%d writes claimed along while a claim pass was in flight", got)
	}
	open()
	eventually(t, "the second starts", func() bool { return led.started() == 2 })
	close(release)
	eventually(t, "the second succeeds", b.statusIs(t, second.ID, task.Succeeded))
}
