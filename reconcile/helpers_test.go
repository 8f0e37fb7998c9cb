package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// testBuckets is the fleet size of every test here.
const testBuckets = 8

// Leases of the tests: bucket leases outlast any clock move a test makes,
// task leases are what the tests let expire.
const (
	bucketTTL = time.Hour
	taskTTL   = 30 * time.Second
)

// testBundle is one memory store on a manual clock, which is the
// database clock: task leases expire when a test moves it, or by the
// store's hooks.
type testBundle struct {
	ctx   context.Context
	clock *clock.Manual
	store *memory.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), clock: clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	b.store = memory.New(memory.WithClock(b.clock.Now))
	t.Cleanup(b.store.Close)
	if _, err := b.store.Migrate(b.ctx, testBuckets); err != nil {
		t.Fatal(err)
	}
	return b
}

// hold takes the leases of buckets for owner (an incarnation, "node/nonce")
// and returns them as held.
func (b *testBundle) hold(t *testing.T, owner string, buckets ...int) []store.HeldBucket {
	t.Helper()
	leases, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{
		Owner: owner, Node: nodeOf(owner), Buckets: bucket.Of(buckets...), TTL: bucketTTL,
	})
	if err != nil {
		t.Fatal(err)
	}
	held := make([]store.HeldBucket, 0, len(leases))
	for _, l := range leases {
		if !l.Held {
			t.Fatalf("%s could not take bucket %d: %+v", owner, l.Bucket, l)
		}
		held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
	}
	return held
}

// nodeOf is the node id of an incarnation.
func nodeOf(owner string) string {
	node, _, _ := strings.Cut(owner, "/")
	return node
}

// running creates a task in bucket bk and has owner, which holds bk under
// held, claim it: a running task with a live task lease.
func (b *testBundle) running(t *testing.T, owner string, held []store.HeldBucket, bk, maxAttempts int) *task.Task {
	t.Helper()
	created, err := b.store.CreateTasks(b.ctx, []store.NewTask{{
		Kind: "work", Key: "key", Bucket: bk, MaxAttempts: maxAttempts,
	}})
	if err != nil {
		t.Fatal(err)
	}
	var only []store.HeldBucket
	for _, h := range held {
		if h.Bucket == bk {
			only = append(only, h)
		}
	}
	claimed, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{
		Owner: owner, Node: nodeOf(owner), Buckets: only, Kinds: []string{"work"}, Limit: 1, LeaseTTL: taskTTL,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].ID != created[0].ID {
		t.Fatalf("%s claimed %+v, want task %d", owner, claimed, created[0].ID)
	}
	return claimed[0]
}

// expire ends the task lease of each task, as a dead owner's would.
func (b *testBundle) expire(t *testing.T, tasks ...*task.Task) {
	t.Helper()
	for _, tk := range tasks {
		if err := b.store.ExpireTaskLease(tk.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *testBundle) get(t *testing.T, id int64) *task.Task {
	t.Helper()
	got, err := b.store.GetTask(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (b *testBundle) events(t *testing.T, id int64) []task.Event {
	t.Helper()
	events, err := b.store.TaskEvents(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

// rescue runs Rescue as owner on held, failing the test on an error.
func (b *testBundle) rescue(t *testing.T, s store.Store, owner string, held []store.HeldBucket) Report {
	t.Helper()
	rep, err := Rescue(b.ctx, s, Request{Owner: owner, Node: nodeOf(owner), Buckets: held, Backoff: testBackoff})
	if err != nil {
		t.Fatalf("Rescue by %s: %v", owner, err)
	}
	return rep
}

// testBackoff waits 7 s per attempt lost, so a delay shows which attempt it
// was computed for.
func testBackoff(attempt int) time.Duration { return time.Duration(attempt) * 7 * time.Second }

// entryFor finds the report's entry of a task.
func entryFor(t *testing.T, rep Report, id int64) Entry {
	t.Helper()
	for _, e := range rep.Entries {
		if e.TaskID == id {
			return e
		}
	}
	t.Fatalf("the report has no entry for task %d: %+v", id, rep.Entries)
	return Entry{}
}

// unchanged fails the test unless the task is as it was read in before.
func (b *testBundle) unchanged(t *testing.T, before *task.Task) {
	t.Helper()
	now := b.get(t, before.ID)
	if now.Status != before.Status || now.StatusVersion != before.StatusVersion || now.Owner != before.Owner {
		t.Errorf("task %d (bucket %d) changed: %s v%d owned by %q, was %s v%d owned by %q",
			before.ID, before.Bucket, now.Status, now.StatusVersion, now.Owner,
			before.Status, before.StatusVersion, before.Owner)
	}
}

// hookedStore lets a test act between a rescue's listing and its moves,
// and fail moves, as a concurrent writer or a broken connection would.
type hookedStore struct {
	store.Store
	// afterListing runs once, after the first listing.
	afterListing func()
	// failMove, when it returns an error for the n-th move (from 1), makes
	// that move fail with it without reaching the store.
	failMove func(n int) error
	moves    int
}

func (h *hookedStore) ExpiredTasks(ctx context.Context, buckets []store.HeldBucket, limit int) ([]*task.Task, error) {
	tasks, err := h.Store.ExpiredTasks(ctx, buckets, limit)
	if f := h.afterListing; f != nil {
		h.afterListing = nil
		f()
	}
	return tasks, err
}

func (h *hookedStore) Transition(ctx context.Context, tr store.Transition) (*task.Task, error) {
	h.moves++
	if h.failMove != nil {
		if err := h.failMove(h.moves); err != nil {
			return nil, err
		}
	}
	return h.Store.Transition(ctx, tr)
}
