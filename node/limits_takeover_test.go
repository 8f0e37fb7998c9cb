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
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// frozenLeases is a holder's store whose lease renewals fail once frozen,
// as for a process that hangs or is cut off from the database: its handlers
// run on and its rows stay running, but its leases lapse.
type frozenLeases struct {
	*memory.Store
	frozen atomic.Bool
}

func (s *frozenLeases) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	if s.frozen.Load() {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
	return s.Store.AcquireBuckets(ctx, req)
}

// takeoverStore is a successor's store that can hold back the two reads a
// takeover depends on: the active rows a limit refresh counts (the read
// fails, as a statement that timed out) and the expired tasks a rescue
// moves (none found yet). Each keeps the window between a takeover and the
// previous holder's rows being settled open as long as the test needs.
type takeoverStore struct {
	*memory.Store
	failUse, holdRescue   atomic.Bool
	useReads, rescueLooks atomic.Int64
}

func (s *takeoverStore) ActiveUse(ctx context.Context, buckets []int) ([]store.ActiveUse, error) {
	if s.failUse.Load() {
		s.useReads.Add(1)
		return nil, errors.New("canceling statement due to statement timeout")
	}
	return s.Store.ActiveUse(ctx, buckets)
}

func (s *takeoverStore) ExpiredTasks(ctx context.Context, buckets []store.HeldBucket, limit int) ([]*task.Task, error) {
	if s.holdRescue.Load() {
		s.rescueLooks.Add(1)
		return []*task.Task{}, nil
	}
	return s.Store.ExpiredTasks(ctx, buckets, limit)
}

// startsOf is how many handlers of limit key k the ledger saw start.
func (l *ledger) startsOf(k string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.order {
		if o == k {
			n++
		}
	}
	return n
}

func (l *ledger) runningOf(k string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running[k]
}

// TestLimitTakeoverCountsThePreviousHoldersRunningRows: n1 runs two tasks
// of limit key K (per-key concurrency 2) and freezes with their handlers
// still running; n2 takes every bucket once the leases lapse. n2 must claim
// nothing in a bucket until it has read the bucket's active rows under its
// new epoch, must then count n1's two rows against K (another key starts,
// K does not), and must start K only once those rows are rescued, never
// more than two at once. Every task succeeds, on n2.
func TestLimitTakeoverCountsThePreviousHoldersRunningRows(t *testing.T) {
	b := setup(t)
	lim := store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}
	// Tasks route by limit key: K and L share a bucket, so that its
	// readiness alone decides what starts.
	lk := b.keysIn(bucket.Of(5), 2)
	K, L := lk[0], lk[1]
	bk := b.policy.Of(K)

	h1 := &frozenLeases{Store: b.store.Handle()}
	t.Cleanup(h1.Close)
	cfg1 := b.config(t, "n1")
	cfg1.Limits = []store.Limit{lim}
	// No timer of n1's fires during the test: it renews no lease (bucket
	// or task) and re-reads no limit, so only the store decides its fate.
	cfg1.BucketLeaseTTL = 2 * time.Hour
	cfg1.TaskLeaseTTL = 2 * time.Hour
	cfg1.NoBalance = true // n2 stands by for every bucket, then takes them all
	old := newLedger()
	oldGate := make(chan struct{})
	n1 := newNodeOn(t, h1, cfg1, map[string]Handler{"fetch": old.handler(oldGate)})
	if err := n1.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	releaseOld := sync.OnceFunc(func() { close(oldGate) })
	t.Cleanup(releaseOld) // before n1's shutdown, which would wait for them

	var kIDs []int64
	for i := range 6 {
		kIDs = append(kIDs, submit(t, n1, SubmitRequest{Kind: "fetch", Key: fmt.Sprintf("order-%d", i), LimitKey: K}).ID)
	}
	eventually(t, "n1 runs two of K", func() bool { return old.started() == 2 })
	claimPassesAfter(t, n1)
	if got := old.started(); got != 2 {
		t.Fatalf("n1 started %d of K, limit 2", got)
	}
	var oldRows []int64
	for _, id := range kIDs {
		if tk := b.get(t, id); tk.Status == task.Running {
			oldRows = append(oldRows, id)
		}
	}
	if len(oldRows) != 2 {
		t.Fatalf("%d rows of K running, want 2", len(oldRows))
	}

	h2 := &takeoverStore{Store: b.store.Handle()}
	t.Cleanup(h2.Close)
	cfg2 := quickRetries(b.config(t, "n2"))
	cfg2.Limits = []store.Limit{lim}
	// No heartbeat in the test's time: the limits are read when the
	// buckets are taken, when the test pokes, and when a rescue moved
	// rows they count.
	cfg2.BucketLeaseTTL = 2 * time.Hour
	cfg2.BucketLeaseHeartbeat = time.Hour
	cfg2.ReconcileInterval = time.Hour // only the takeover and the test rescue
	cfg2.NoBalance = true
	fresh := newLedger()
	freshGate := make(chan struct{})
	n2 := newNodeOn(t, h2, cfg2, map[string]Handler{"fetch": fresh.handler(freshGate)})
	if err := n2.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	releaseFresh := sync.OnceFunc(func() { close(freshGate) })
	t.Cleanup(releaseFresh)
	if held := n2.Held(); len(held) != 0 {
		t.Fatalf("n2 holds %v while n1 renews", held)
	}

	// n1 freezes; its leases lapse and n2 takes them.
	h2.failUse.Store(true)
	h2.holdRescue.Store(true)
	h1.frozen.Store(true)
	for i := range testBuckets {
		if err := b.store.ExpireBucketLease(i); err != nil {
			t.Fatal(err)
		}
	}
	n2.leaseLoop.poke()
	eventually(t, "n2 holds every bucket", func() bool { return len(n2.Held()) == testBuckets })
	epoch, _ := n2.keeper.Holds(bk)
	other := submit(t, n2, SubmitRequest{Kind: "fetch", Key: "order-6", LimitKey: L})

	// Before n2 has read the bucket's rows under its epoch, nothing in it
	// starts, not even L, whose key has no limit reached.
	reads := h2.useReads.Load()
	n2.limitLoop.poke()
	eventually(t, "n2 tried to read the rows of its buckets", func() bool { return h2.useReads.Load() > reads })
	claimPassesAfter(t, n2)
	if got := fresh.started(); got != 0 {
		t.Fatalf("n2 started %d tasks in bucket %d before reading its active rows", got, bk)
	}

	// Once read, n1's two running rows count against K: L starts, K not.
	h2.failUse.Store(false)
	n2.limitLoop.poke()
	eventually(t, "n2 read the bucket's rows under its epoch", func() bool {
		n2.limits.mu.Lock()
		defer n2.limits.mu.Unlock()
		e, ok := n2.limits.ready[bk]
		return ok && e == epoch
	})
	n2.limits.mu.Lock()
	foreign := 0
	for _, u := range n2.limits.foreign {
		if u.kind == "fetch" && u.key == K {
			foreign++
		}
	}
	running := n2.limits.running[kindKey{"fetch", K}]
	n2.limits.mu.Unlock()
	if foreign != 2 || running != 2 {
		t.Fatalf("n2 counts %d of K running, %d of them the previous holder's; want n1's 2", running, foreign)
	}
	eventually(t, "L starts on n2", func() bool { return fresh.startsOf(L) == 1 })
	eventually(t, "the takeover's rescue pass looked", func() bool { return h2.rescueLooks.Load() > 0 })
	claimPassesAfter(t, n2)
	if got := fresh.startsOf(K); got != 0 {
		t.Fatalf("n2 started %d of K while n1's two attempts still run", got)
	}
	for _, id := range oldRows {
		if tk := b.get(t, id); tk.Status != task.Running || tk.Owner != n1.Incarnation() || tk.Epoch >= epoch {
			t.Fatalf("task %d is %s, owner %s, epoch %d: want still running under n1's old epoch",
				id, tk.Status, tk.Owner, tk.Epoch)
		}
	}

	// Rescued, n1's rows stop counting: K starts on n2, two at a time.
	h2.holdRescue.Store(false)
	n2.rescuer.loop.poke()
	eventually(t, "n2 runs two of K", func() bool { return fresh.runningOf(K) == 2 })
	claimPassesAfter(t, n2)
	if got := fresh.startsOf(K); got != 2 {
		t.Fatalf("n2 started %d of K, limit 2", got)
	}
	releaseFresh()
	for _, id := range append(kIDs, other.ID) {
		eventually(t, "every task succeeds", b.statusIs(t, id, task.Succeeded))
	}
	if peaks, _ := fresh.peaks(); peaks[K] > 2 {
		t.Errorf("n2 ran %d of K at once, limit 2", peaks[K])
	}
	for _, id := range oldRows {
		if got := b.trail(t, id); got != "queued running retrying running succeeded" {
			t.Errorf("task %d: trail %q, want n1's attempt rescued and retried", id, got)
		}
		if got := b.get(t, id); got.Node != "n2" {
			t.Errorf("task %d succeeded on %q, want n2", id, got.Node)
		}
	}

	// n1's handlers return late; their outcomes are fenced, and n1 never
	// started anything after its leases lapsed.
	releaseOld()
	eventually(t, "n1's late attempts are settled", func() bool {
		registered, _, _ := n1.attempts.counts()
		return registered == 0
	})
	if got := old.started(); got != 2 {
		t.Errorf("n1 started %d tasks, want only its first two", got)
	}
	for _, id := range oldRows {
		if got := b.get(t, id); got.Status != task.Succeeded || got.Node != "n2" {
			t.Errorf("task %d after n1's late outcome: %s on %s", id, got.Status, got.Node)
		}
	}
}
