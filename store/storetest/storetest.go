// Package storetest is the one contract suite that every store.Store runs.
// A behaviour added to one store is added here first; a store passes when
// Run passes.
package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Harness is what a store provides to run the suite: fresh stores, and ways
// to make time pass for one lease without waiting for it, as an expired row
// looks to the database.
type Harness struct {
	// Open returns a fresh, unmigrated store on its own data, closed when
	// the test ends.
	Open func(t *testing.T) store.Store
	// Reopen returns a second handle on the same data, as a second process
	// would have; closed when the test ends.
	Reopen func(t *testing.T, s store.Store) store.Store
	// ExpireBucketLease moves a bucket lease's expiry into the past.
	ExpireBucketLease func(t *testing.T, s store.Store, bucket int)
	// ExpireTaskLease moves an active task's lease expiry into the past.
	ExpireTaskLease func(t *testing.T, s store.Store, id int64)
	// ExpireNode moves a node's liveness into the past.
	ExpireNode func(t *testing.T, s store.Store, incarnation string)
	// SetSchemaVersion records the schema as being at version, as a newer
	// binary's migration would.
	SetSchemaVersion func(t *testing.T, s store.Store, version int)
	// LockTask holds a task's row as another transaction's row lock would
	// (an operator's open transaction), until unlock is called.
	LockTask func(t *testing.T, s store.Store, id int64) (unlock func())
	// AgeFinished moves a finished task's end (finished_at) by into the
	// past, as if it had finished that long ago.
	AgeFinished func(t *testing.T, s store.Store, id int64, by time.Duration)
	// Parallel runs the suite's tests in parallel: for a store whose tests
	// spend their time waiting on a server (creating, migrating and dropping
	// a database each), where it cuts the suite's time several-fold. A
	// store whose tests keep the CPU busy gains nothing from it and only
	// stretches each test.
	Parallel bool
	// OneWriter says the store runs its writes one at a time (SQLite's
	// single writer): concurrent claims cannot interleave inside the store,
	// so the suite's concurrency cases run at a tenth of their size, which
	// shows the rule as well and spares minutes of a race-instrumented
	// engine.
	OneWriter bool
}

// Run runs the whole contract suite.
func Run(t *testing.T, h Harness) {
	t.Run("Fleet", func(t *testing.T) { testFleet(t, h) })
	t.Run("Tasks", func(t *testing.T) { testTasks(t, h) })
	t.Run("Transition", func(t *testing.T) { testTransition(t, h) })
	t.Run("BucketLeases", func(t *testing.T) { testBucketLeases(t, h) })
	t.Run("Handoffs", func(t *testing.T) { testHandoffs(t, h) })
	t.Run("Claim", func(t *testing.T) { testClaim(t, h) })
	t.Run("Fencing", func(t *testing.T) { testFencing(t, h) })
	t.Run("LockedRows", func(t *testing.T) { testLockedRows(t, h) })
	t.Run("Expired", func(t *testing.T) { testExpired(t, h) })
	t.Run("Audit", func(t *testing.T) { testAudit(t, h) })
	t.Run("Nodes", func(t *testing.T) { testNodes(t, h) })
	t.Run("Commands", func(t *testing.T) { testCommands(t, h) })
	t.Run("Schedules", func(t *testing.T) { testSchedules(t, h) })
	t.Run("Notifications", func(t *testing.T) { testNotifications(t, h) })
	t.Run("Filters", func(t *testing.T) { testFilters(t, h) })
	t.Run("Pipelines", func(t *testing.T) { testPipelines(t, h) })
	t.Run("Limits", func(t *testing.T) {
		testLimits(t, h)
		testLimitsFresh(t, h)
		testLimitsRoundRobin(t, h)
		testLimitsKeyUse(t, h)
	})
	t.Run("Retention", func(t *testing.T) { testRetention(t, h) })
	t.Run("Console", func(t *testing.T) { testConsole(t, h) })
	t.Run("Metadata", func(t *testing.T) { testMetadata(t, h) })
}

// numBuckets is small so that tests can name every bucket.
const numBuckets = 8

// leaseTTL is long enough that nothing expires by itself during a test on a
// loaded machine (ten thousand claims on SQLite have taken 100 s on a busy
// 2-core machine); tests expire leases through the Harness instead.
const leaseTTL = 10 * time.Minute

type testBundle struct {
	t   *testing.T
	h   Harness
	s   store.Store
	ctx context.Context
}

// setup opens and migrates a fresh store, for a test that runs in
// parallel with the others.
func setup(t *testing.T, h Harness) *testBundle {
	t.Helper()
	parallel(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	s := h.Open(t)
	if _, err := s.Migrate(ctx, numBuckets); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &testBundle{t: t, h: h, s: s, ctx: ctx}
}

func (b *testBundle) create(nt ...store.NewTask) []*task.Task {
	b.t.Helper()
	for i := range nt {
		if nt[i].Kind == "" {
			nt[i].Kind = "noop"
		}
	}
	out, err := b.s.CreateTasks(b.ctx, nt)
	if err != nil {
		b.t.Fatalf("CreateTasks: %v", err)
	}
	return out
}

func (b *testBundle) get(id int64) *task.Task {
	b.t.Helper()
	got, err := b.s.GetTask(b.ctx, id)
	if err != nil {
		b.t.Fatalf("GetTask(%d): %v", id, err)
	}
	return got
}

// hold acquires buckets for owner and fails the test unless all are held.
func (b *testBundle) hold(owner string, buckets ...int) []store.HeldBucket {
	b.t.Helper()
	leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{
		Owner: owner, Node: nodeOf(owner), Buckets: bucket.Of(buckets...), TTL: leaseTTL,
	})
	if err != nil {
		b.t.Fatalf("AcquireBuckets(%s, %v): %v", owner, buckets, err)
	}
	held := make([]store.HeldBucket, 0, len(leases))
	for _, l := range leases {
		if !l.Held {
			b.t.Fatalf("%s could not take bucket %d: held by %q", owner, l.Bucket, l.Holder)
		}
		held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
	}
	return held
}

func (b *testBundle) claim(owner string, held []store.HeldBucket, limit int, kinds ...string) []*task.Task {
	b.t.Helper()
	if len(kinds) == 0 {
		kinds = []string{"noop"}
	}
	got, err := b.s.ClaimTasks(b.ctx, store.ClaimRequest{
		Owner: owner, Node: nodeOf(owner), Buckets: held, Kinds: kinds, Limit: limit, LeaseTTL: leaseTTL,
	})
	if err != nil {
		b.t.Fatalf("ClaimTasks: %v", err)
	}
	return got
}

// advance applies one fenced transition and returns its outcome.
func (b *testBundle) advance(owner string, at store.ActiveTransition) store.Outcome {
	b.t.Helper()
	if at.Node == "" {
		at.Node = nodeOf(owner)
	}
	out, err := b.s.AdvanceActive(b.ctx, owner, []store.ActiveTransition{at})
	if err != nil {
		b.t.Fatalf("AdvanceActive: %v", err)
	}
	if len(out) != 1 {
		b.t.Fatalf("AdvanceActive answered %d outcomes for 1 transition", len(out))
	}
	return out[0]
}

// runningTask creates one task in bucket and claims it for owner.
func (b *testBundle) runningTask(owner string, bucketNo int) (*task.Task, []store.HeldBucket) {
	b.t.Helper()
	created := b.create(store.NewTask{Key: "k", Bucket: bucketNo})[0]
	held := b.hold(owner, bucketNo)
	claimed := b.claim(owner, held, 10)
	if len(claimed) != 1 || claimed[0].ID != created.ID {
		b.t.Fatalf("claimed %v, want task %d", ids(claimed), created.ID)
	}
	return claimed[0], held
}

// eventually polls cond until it holds or the deadline, stretched for the
// machine (patience.Scale), passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	within = patience.Scale(within)
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// parallel runs the test beside the suite's others when the harness asks
// for it (Harness.Parallel); each test has a store of its own. A test may
// open several stores: it asks once.
func parallel(t *testing.T, h Harness) {
	if !h.Parallel {
		return
	}
	if _, asked := parallelTests.LoadOrStore(t, true); !asked {
		t.Parallel()
	}
}

var parallelTests sync.Map // *testing.T -> true, once it called t.Parallel

func nodeOf(owner string) string { return "node-" + owner }

func ids(ts []*task.Task) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}
