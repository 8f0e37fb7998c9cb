package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// testBuckets is the fleet size of every test here.
const testBuckets = 64

// testBundle is a fleet of one memory store; nodes made from it share the
// data through their own handles, as processes on one database do.
type testBundle struct {
	ctx    context.Context
	store  *memory.Store
	policy bucket.Policy
	// manual is the clock of the store and of every node, when the test
	// asked for one; nil means real time.
	manual *clock.Manual
}

type bundleOption func(*testBundle)

// withManualClock drives the store and the nodes with one manual clock.
func withManualClock() bundleOption {
	return func(b *testBundle) {
		b.manual = clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	}
}

func setup(t testing.TB, opts ...bundleOption) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background()}
	for _, o := range opts {
		o(b)
	}
	var storeOpts []memory.Option
	if b.manual != nil {
		storeOpts = append(storeOpts, memory.WithClock(b.manual.Now))
	}
	b.store = memory.New(storeOpts...)
	t.Cleanup(b.store.Close)
	if _, err := b.store.Migrate(b.ctx, testBuckets); err != nil {
		t.Fatal(err)
	}
	policy, err := bucket.NewPolicy(testBuckets)
	if err != nil {
		t.Fatal(err)
	}
	b.policy = policy
	return b
}

// config is a node configuration for tests: every bucket unless buckets is
// given, the bundle's clock, and a logger that writes to the test.
func (b *testBundle) config(t testing.TB, id string, buckets ...int) Config {
	cfg := Config{
		NodeID: id,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	}
	if len(buckets) == 0 {
		cfg.AllBuckets = true
	} else {
		cfg.Buckets = bucket.Of(buckets...)
	}
	if b.manual != nil {
		cfg.Clock = b.manual
		// Lease timers must not fire while a test moves its clock by
		// seconds to make retries due or timeouts pass.
		cfg.BucketLeaseTTL = time.Hour
	}
	return cfg
}

// newNode makes a node on a handle of its own, with handlers registered,
// not started. Shutdown runs at the end of the test.
func (b *testBundle) newNode(t testing.TB, cfg Config, handlers map[string]Handler) *Node {
	t.Helper()
	h := b.store.Handle()
	t.Cleanup(h.Close)
	return newNodeOn(t, h, cfg, handlers)
}

// newNodeOn is newNode on a store of the test's choosing.
func newNodeOn(t testing.TB, s store.Store, cfg Config, handlers map[string]Handler) *Node {
	t.Helper()
	n, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for kind, fn := range handlers {
		n.Register(kind, fn)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("shutdown of %s: %v", n.ID(), err)
		}
		// An outcome the store refused (not fenced: refused) is a bug in
		// the node or the store, never an expected event.
		if got := n.refusals.Load(); got != 0 {
			t.Errorf("node %s: the store refused %d outcomes; the log says which", n.ID(), got)
		}
	})
	return n
}

// startNode is newNode and Start.
func (b *testBundle) startNode(t testing.TB, cfg Config, handlers map[string]Handler) *Node {
	t.Helper()
	n := b.newNode(t, cfg, handlers)
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// keysIn returns count distinct keys whose buckets are in set.
func (b *testBundle) keysIn(set bucket.Set, count int) []string {
	var keys []string
	for i := 0; len(keys) < count; i++ {
		if k := fmt.Sprintf("key-%d", i); set.Contains(b.policy.Of(k)) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (b *testBundle) get(t *testing.T, id int64) *task.Task {
	t.Helper()
	got, err := b.store.GetTask(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// statusIs reports whether task id is in status now.
func (b *testBundle) statusIs(t *testing.T, id int64, status task.Status) func() bool {
	return func() bool { return b.get(t, id).Status == status }
}

// trail is a task's audit trail as its states: "queued running succeeded".
func (b *testBundle) trail(t *testing.T, id int64) string {
	t.Helper()
	events, err := b.store.TaskEvents(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for i, e := range events {
		if i > 0 {
			s += " "
		}
		s += string(e.To)
	}
	return s
}

// eventually polls cond until it holds, failing the test after a deadline
// far beyond what any correct run needs.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(15 * time.Second))
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

// advanceUntil moves the manual clock by step until cond holds, giving the
// node's goroutines a moment between steps to act on each one.
func (b *testBundle) advanceUntil(t *testing.T, what string, step time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(15 * time.Second))
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out advancing the clock until %s", what)
		}
		b.manual.Advance(step)
		<-tick.C
	}
}

// claimPassesAfter waits until the node has finished two more claim passes
// than it had when called: at least one of them began after the call, so
// whatever it could claim then, it has.
func claimPassesAfter(t *testing.T, n *Node) {
	t.Helper()
	target := n.claimPasses.Load() + 2
	eventually(t, "two more claim passes", func() bool {
		n.claimLoop.poke()
		return n.claimPasses.Load() >= target
	})
}

// receive waits for a value from ch, failing the test after a deadline.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience.Scale(15 * time.Second)):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// submit submits through n, failing the test on a refusal.
func submit(t *testing.T, n *Node, req SubmitRequest) *task.Task {
	t.Helper()
	got, err := n.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// countByStatus counts the fleet's tasks per status.
func (b *testBundle) countByStatus(t *testing.T) map[task.Status]int {
	t.Helper()
	tasks, err := b.store.ListTasks(b.ctx, store.TaskFilter{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[task.Status]int{}
	for _, tk := range tasks {
		out[tk.Status]++
	}
	return out
}
