package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
)

// These tests hold the lease rules of DESIGN §6 with an injected clock: a
// node that never got a bucket keeps asking, a holder stops at once on a
// definite loss, a failed renewal is not a loss, and a passed local deadline
// is.

const testTTL = 15 * time.Second

type leaseBundle struct {
	clock *clock.Manual
	store *memory.Store
}

func setupLeases(t *testing.T) *leaseBundle {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	s := memory.New(memory.WithClock(clk.Now))
	t.Cleanup(s.Close)
	if _, err := s.Migrate(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	return &leaseBundle{clock: clk, store: s}
}

// events records what a keeper told its node.
type events struct {
	mu       sync.Mutex
	acquired []store.HeldBucket
	lost     []int
}

func (e *events) lostBuckets() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.lost...)
}

func (lb *leaseBundle) keeper(t *testing.T, s store.Store, owner string, declared bucket.Set) (*leaseKeeper, *events) {
	ev := &events{}
	k := &leaseKeeper{
		store: s, owner: owner, node: "node-" + owner, declared: declared,
		ttl: testTTL, heartbeat: testTTL / 3, margin: deadlineMargin(testTTL),
		clock: lb.clock, log: zaptest.NewLogger(t),
		onAcquired: func(h []store.HeldBucket) {
			ev.mu.Lock()
			ev.acquired = append(ev.acquired, h...)
			ev.mu.Unlock()
		},
		onLost: func(b []int) {
			ev.mu.Lock()
			ev.lost = append(ev.lost, b...)
			ev.mu.Unlock()
		},
		held: map[int]heldLease{},
	}
	t.Cleanup(k.stopTimer)
	return k, ev
}

func TestASecondNodeStandsByWhileTheFirstHolds(t *testing.T) {
	lb := setupLeases(t)
	first, _ := lb.keeper(t, lb.store, "a", bucket.Of(0, 1, 2))
	if err := first.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(first.Held()); got != 3 {
		t.Fatalf("the first node holds %d of 3 free buckets", got)
	}

	second, ev := lb.keeper(t, lb.store, "b", bucket.Of(0, 1, 2))
	for i := 0; i < 3; i++ {
		if err := second.tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		lb.clock.Advance(testTTL / 3)
		if err := first.tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if held := second.Held(); len(held) != 0 {
		t.Errorf("a second node holds %v while the first lives: its tasks would run twice", held)
	}
	if len(ev.acquired) != 0 {
		t.Errorf("the standby was told it acquired %v", ev.acquired)
	}
}

func TestAStandbyTakesOverAfterExpiryWithANewEpoch(t *testing.T) {
	lb := setupLeases(t)
	first, _ := lb.keeper(t, lb.store, "a", bucket.Of(5))
	_ = first.tick(context.Background())
	epoch, _ := first.Holds(5)

	second, ev := lb.keeper(t, lb.store, "b", bucket.Of(5))
	_ = second.tick(context.Background())
	// The first node dies: no more renewals. The standby keeps asking and
	// takes the bucket once the lease has expired.
	lb.clock.Advance(testTTL + time.Second)
	if err := second.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, ok := second.Holds(5)
	if !ok || got != epoch+1 {
		t.Fatalf("standby after expiry: held=%v epoch=%d, want epoch %d", ok, got, epoch+1)
	}
	if len(ev.acquired) != 1 || ev.acquired[0] != (store.HeldBucket{Bucket: 5, Epoch: epoch + 1}) {
		t.Errorf("standby was told %v, want bucket 5 at epoch %d so it rescues at once", ev.acquired, epoch+1)
	}
}

func TestAHolderWhoseLeaseWentElsewhereStopsAtOnce(t *testing.T) {
	lb := setupLeases(t)
	holder, ev := lb.keeper(t, lb.store, "a", bucket.Of(1, 2))
	_ = holder.tick(context.Background())

	// What a partition looks like from the database: bucket 1's lease
	// lapsed and another node took it while this one was away.
	lb.store.ExpireBucketLease(1)
	successor, _ := lb.keeper(t, lb.store, "b", bucket.Of(1))
	if err := successor.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := successor.Holds(1); !ok {
		t.Fatal("the successor could not take the expired lease")
	}

	if err := holder.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := holder.Holds(1); ok {
		t.Error("the holder kept bucket 1 after it went to another node")
	}
	if _, ok := holder.Holds(2); !ok {
		t.Error("the holder dropped bucket 2, which nobody took")
	}
	if lost := ev.lostBuckets(); len(lost) != 1 || lost[0] != 1 {
		t.Errorf("lost %v, want [1] so its handlers are cancelled", lost)
	}
	leases, _ := lb.store.ListBuckets(context.Background())
	if leases[1].Holder != "b" {
		t.Errorf("bucket 1 holder is %q: the old holder wrote over its successor", leases[1].Holder)
	}
}

// unreachable is a store whose lease statements fail, as they do when the
// database cannot be reached.
type unreachable struct {
	store.Store
	down bool
	mu   sync.Mutex
}

func (u *unreachable) setDown(down bool) {
	u.mu.Lock()
	u.down = down
	u.mu.Unlock()
}

func (u *unreachable) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	u.mu.Lock()
	down := u.down
	u.mu.Unlock()
	if down {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
	return u.Store.AcquireBuckets(ctx, req)
}

func TestAFailedRenewalDoesNotStopTheHolder(t *testing.T) {
	lb := setupLeases(t)
	s := &unreachable{Store: lb.store}
	holder, ev := lb.keeper(t, s, "a", bucket.Of(1))
	if err := holder.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.setDown(true)
	lb.clock.Advance(testTTL / 3)
	if err := holder.tick(context.Background()); err == nil {
		t.Fatal("a renewal against an unreachable database reported success")
	}
	if _, ok := holder.Holds(1); !ok {
		t.Error("one failed renewal stopped the holder; the lease had not expired and nobody else could take it")
	}
	if lost := ev.lostBuckets(); len(lost) != 0 {
		t.Errorf("handlers cancelled for %v after one failed renewal", lost)
	}
	// The database comes back before the deadline: service was never
	// interrupted, and the epoch is unchanged.
	s.setDown(false)
	lb.clock.Advance(testTTL / 3)
	if err := holder.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if epoch, ok := holder.Holds(1); !ok || epoch != 1 {
		t.Errorf("after the database came back: held=%v epoch=%d, want the same lease", ok, epoch)
	}
}

func TestAPassedDeadlineStopsTheHolder(t *testing.T) {
	lb := setupLeases(t)
	s := &unreachable{Store: lb.store}
	holder, ev := lb.keeper(t, s, "a", bucket.Of(1, 2))
	_ = holder.tick(context.Background())
	s.setDown(true)

	// Renewals keep failing. Just before the local deadline the node still
	// serves; at the deadline its own timer stops it, with no renewal
	// attempt needed to notice.
	margin := deadlineMargin(testTTL)
	lb.clock.Advance(testTTL - margin - time.Millisecond)
	if len(holder.Held()) != 2 {
		t.Fatalf("dropped buckets before the local deadline: %v", holder.Held())
	}
	lb.clock.Advance(time.Millisecond)
	if held := holder.Held(); len(held) != 0 {
		t.Errorf("still holding %v past the local deadline", held)
	}
	if lost := ev.lostBuckets(); len(lost) != 2 {
		t.Errorf("deadline timer reported %v lost, want both buckets so their handlers are cancelled", lost)
	}
	// The deadline comes before the database's expiry, by the margin:
	// nobody else could have taken the buckets yet.
	leases, _ := lb.store.ListBuckets(context.Background())
	if leases[1].Holder != "a" {
		t.Errorf("the database lease expired before the local deadline: %+v", leases[1])
	}
}

func TestTheDeadlineIsAnchoredBeforeTheRenewalWasSent(t *testing.T) {
	lb := setupLeases(t)
	slow := &slowStore{Store: lb.store, clock: lb.clock, delay: 4 * time.Second}
	holder, _ := lb.keeper(t, slow, "a", bucket.Of(1))
	sent := lb.clock.Now()
	if err := holder.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := sent.Add(testTTL - deadlineMargin(testTTL))
	holder.mu.Lock()
	got := holder.held[1].deadline
	holder.mu.Unlock()
	if !got.Equal(want) {
		t.Errorf("deadline %v, want %v: anchored at the send, not at the answer", got, want)
	}
}

// slowStore answers lease statements after the clock has moved on, as a
// slow network or a busy database does.
type slowStore struct {
	store.Store
	clock *clock.Manual
	delay time.Duration
}

func (s *slowStore) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	s.clock.Advance(s.delay)
	return s.Store.AcquireBuckets(ctx, req)
}

func TestReleaseLetsAStandbyTakeOverAtOnce(t *testing.T) {
	lb := setupLeases(t)
	holder, _ := lb.keeper(t, lb.store, "a", bucket.Of(3))
	_ = holder.tick(context.Background())
	standby, _ := lb.keeper(t, lb.store, "b", bucket.Of(3))
	_ = standby.tick(context.Background())

	holder.release(context.Background(), bucket.Set{})
	if len(holder.Held()) != 0 {
		t.Error("the releasing node still holds buckets")
	}
	if err := standby.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if epoch, ok := standby.Holds(3); !ok || epoch != 2 {
		t.Errorf("standby after release: held=%v epoch=%d, want epoch 2 without waiting for expiry", ok, epoch)
	}
}

func TestRetakingItsOwnBucketUnderANewEpochEndsTheOldEpochsContext(t *testing.T) {
	// The node's lease ran out in the database (a long pause, a slow
	// renewal) before its local deadline passed, and its next tick took
	// the bucket back under epoch + 1. The attempts claimed under the old
	// epoch are fenced in the store, and must stop here too.
	lb := setupLeases(t)
	k, ev := lb.keeper(t, lb.store, "a", bucket.Of(3))
	if err := k.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	oldEpoch, oldCtx, ok := k.lease(3)
	if !ok {
		t.Fatal("bucket 3 not held after the first tick")
	}
	if err := lb.store.ExpireBucketLease(3); err != nil {
		t.Fatal(err)
	}
	if err := k.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	newEpoch, newCtx, ok := k.lease(3)
	if !ok || newEpoch != oldEpoch+1 {
		t.Fatalf("after the retake: held %v under epoch %d, want epoch %d", ok, newEpoch, oldEpoch+1)
	}
	select {
	case <-oldCtx.Done():
	default:
		t.Fatal("the old epoch's context is still live: its handlers would keep running beside the new epoch's")
	}
	if cause := context.Cause(oldCtx); !errors.Is(cause, ErrBucketLost) {
		t.Errorf("the old epoch's context ended with %v, want ErrBucketLost", cause)
	}
	if newCtx.Err() != nil {
		t.Errorf("the new epoch's context is done: %v", context.Cause(newCtx))
	}
	if got := ev.lostBuckets(); len(got) != 1 || got[0] != 3 {
		t.Errorf("lost buckets reported %v, want [3]", got)
	}
	// A plain renewal under the same epoch keeps the context.
	if err := k.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, again, _ := k.lease(3); again != newCtx || newCtx.Err() != nil {
		t.Error("a renewal under the same epoch replaced or ended the lease's context")
	}
}

func TestAPassedDeadlineEndsTheLeasesContext(t *testing.T) {
	lb := setupLeases(t)
	k, _ := lb.keeper(t, lb.store, "a", bucket.Of(4))
	if err := k.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, ctx, _ := k.lease(4)
	lb.clock.Advance(testTTL) // no renewal: past the local deadline
	eventuallyDone(t, ctx)
	if cause := context.Cause(ctx); !errors.Is(cause, ErrBucketLost) {
		t.Errorf("the lease's context ended with %v, want ErrBucketLost", cause)
	}
	if _, _, ok := k.lease(4); ok {
		t.Error("the bucket is still held past its local deadline")
	}
}

// eventuallyDone waits for ctx to end, failing the test after a generous
// deadline: the keeper's timer runs in a goroutine of its own.
func eventuallyDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(patience.Scale(10 * time.Second)):
		t.Fatal("the context did not end within 10s")
	}
}

// lateLeases lets its first few lease statements run out of their time, as
// a busy SQLite writer or a loaded server does, then answers.
type lateLeases struct {
	store.Store
	mu   sync.Mutex
	late int // statements still to hold until their context ends
}

func (l *lateLeases) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	l.mu.Lock()
	late := l.late > 0
	if late {
		l.late--
	}
	l.mu.Unlock()
	if late {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.Store.AcquireBuckets(ctx, req)
}

func TestAStartWhoseFirstLeaseStatementsRunOutOfTimeTriesAgain(t *testing.T) {
	b := setup(t)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &lateLeases{Store: h, late: 2}
	cfg := b.config(t, "slow-start", 1, 2)
	cfg.BucketLeaseTTL, cfg.BucketLeaseHeartbeat = 3*time.Second, time.Second
	n := newNodeOn(t, s, cfg, nil)
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("a start whose first two lease statements ran out of time failed: %v", err)
	}
	if held := n.Held(); len(held) != 2 {
		t.Errorf("held %v after start, want buckets 1 and 2", held)
	}
}

func TestAStartGivesUpWhenTheLeaseStatementsKeepRunningOutOfTime(t *testing.T) {
	b := setup(t)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &lateLeases{Store: h, late: 1000}
	cfg := b.config(t, "never-answered", 1)
	cfg.BucketLeaseTTL, cfg.BucketLeaseHeartbeat = 600*time.Millisecond, 200*time.Millisecond
	n := newNodeOn(t, s, cfg, nil)
	err := n.Start(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start against lease statements that never answer: %v, want a deadline error", err)
	}
	if left := 1000 - s.late; left > 10 {
		t.Errorf("sent %d lease statements before giving up, want about one TTL's worth", left)
	}
}

// steppedStore is a memory store whose clock runs ahead of the nodes' by
// a step the test sets, as a new primary's clock may after a failover.
func steppedStore(t *testing.T, clk *clock.Manual) (store.Store, *atomic.Int64) {
	t.Helper()
	var step atomic.Int64
	s := memory.New(memory.WithClock(func() time.Time { return clk.Now().Add(time.Duration(step.Load())) }))
	t.Cleanup(s.Close)
	if _, err := s.Migrate(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	return s, &step
}

func TestADatabaseClockThatStepsForwardDoesNotHandALiveHoldersBucketToItsStandby(t *testing.T) {
	lb := setupLeases(t)
	s, step := steppedStore(t, lb.clock)
	holder, ev := lb.keeper(t, s, "a", bucket.Of(3))
	standby, _ := lb.keeper(t, s, "b", bucket.Of(3))
	tick := func(k *leaseKeeper) {
		t.Helper()
		if err := k.tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	tick(holder)
	tick(standby)
	lb.clock.Advance(testTTL / 3)
	tick(holder)
	tick(standby)

	// The database fails over to a primary whose clock is an hour ahead:
	// by that clock the holder's lease expired long ago, though the holder
	// renewed it a moment ago and serves the bucket.
	step.Store(int64(time.Hour))
	tick(standby)
	if _, ok := standby.Holds(3); ok {
		t.Fatal("the standby took a live holder's bucket because the database's clock stepped forward")
	}
	tick(holder)
	if epoch, ok := holder.Holds(3); !ok || epoch != 1 {
		t.Fatalf("holder after the step: held=%v epoch=%d, want its lease renewed under epoch 1", ok, epoch)
	}
	// A TTL on, every node reckons on the new clock; the holder renewed on
	// it all along and keeps its bucket.
	for range 6 {
		lb.clock.Advance(testTTL / 3)
		tick(holder)
		tick(standby)
		if _, ok := standby.Holds(3); ok {
			t.Fatal("the standby took the bucket while its holder renewed it every heartbeat")
		}
	}
	if lost := ev.lostBuckets(); len(lost) != 0 {
		t.Fatalf("the holder lost %v to a clock step", lost)
	}
	// The holder dies: its lease runs out on the new clock, and the
	// standby takes the bucket as after any crash.
	for range 5 {
		lb.clock.Advance(testTTL / 3)
		tick(standby)
	}
	if epoch, ok := standby.Holds(3); !ok || epoch != 2 {
		t.Errorf("standby after its holder died: held=%v epoch=%d, want the bucket under epoch 2", ok, epoch)
	}
}

func TestADatabaseClockThatStepsBackIsAdoptedAtOnce(t *testing.T) {
	lb := setupLeases(t)
	s, step := steppedStore(t, lb.clock)
	holder, _ := lb.keeper(t, s, "a", bucket.Of(3))
	standby, _ := lb.keeper(t, s, "b", bucket.Of(3))
	_ = holder.tick(context.Background())
	_ = standby.tick(context.Background())
	step.Store(int64(-time.Minute))
	// A minute back, the holder's lease looks a minute longer; the holder
	// dies, and its standby waits that minute out, no more.
	for range 4 {
		lb.clock.Advance(testTTL / 3)
		_ = standby.tick(context.Background())
	}
	if _, ok := standby.Holds(3); ok {
		t.Fatal("the standby took the bucket before its lease ran out on the database's clock")
	}
	for range 16 {
		lb.clock.Advance(testTTL / 3)
		_ = standby.tick(context.Background())
	}
	if epoch, ok := standby.Holds(3); !ok || epoch != 2 {
		t.Errorf("standby after the lease ran out: held=%v epoch=%d, want epoch 2", ok, epoch)
	}
}

// failingLeases fails the next fail lease statements at once, as a
// database that refuses connections for a moment does.
type failingLeases struct {
	store.Store
	fail atomic.Int32
}

func (f *failingLeases) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	}
	return f.Store.AcquireBuckets(ctx, req)
}

func TestAFailedRenewalIsTriedAgainBeforeTheNextHeartbeat(t *testing.T) {
	// With the heartbeat at TTL/3, a node that waited a whole heartbeat
	// after each failed renewal would reach its local deadline after two
	// failures in a row. It tries again sooner, and keeps its buckets.
	b := setup(t, withManualClock())
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &failingLeases{Store: h}
	cfg := b.config(t, "retrying", 1)
	cfg.BucketLeaseTTL, cfg.BucketLeaseHeartbeat = 15*time.Second, 5*time.Second
	n := newNodeOn(t, s, cfg, nil)
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease loop's first pass", func() bool { return n.leasePasses.Load() >= 1 })
	s.fail.Store(2)
	b.advanceUntil(t, "two failed renewals and one sent after them", 100*time.Millisecond, func() bool {
		return s.fail.Load() < 0
	})
	passes := n.leasePasses.Load()
	b.advanceUntil(t, "the lease pass after that", 100*time.Millisecond, func() bool {
		return n.leasePasses.Load() > passes
	})
	held := n.Held()
	if len(held) != 1 || held[0].Epoch != 1 {
		t.Fatalf("after two failed renewals: held %+v, want bucket 1 still under epoch 1", held)
	}
}

// TestANotificationWakesOnlyTheHolderOfItsBucket: a task's notification
// wakes a node's claim loop only for a bucket it holds, whose lease has not
// passed its deadline and that it is not handing over.
func TestANotificationWakesOnlyTheHolderOfItsBucket(t *testing.T) {
	lb := setupLeases(t)
	k, _ := lb.keeper(t, lb.store, "a", bucket.Of(1, 2, 3))
	now := lb.clock.Now()
	k.held[1] = newHeldLease(1, now.Add(time.Minute))
	k.held[2] = newHeldLease(1, now.Add(-time.Second)) // past its deadline
	k.held[3] = newHeldLease(1, now.Add(time.Minute))
	k.giving = map[int]bool{3: true}
	for _, c := range []struct {
		buckets bucket.Set
		want    bool
	}{
		{bucket.Of(1), true},
		{bucket.Of(0, 1), true},
		{bucket.Of(2), false},
		{bucket.Of(3), false},
		{bucket.Of(0, 4), false},
		{bucket.Set{}, false},
	} {
		if got := k.holdsAny(c.buckets); got != c.want {
			t.Errorf("holdsAny(%s) = %v, want %v", c.buckets, got, c.want)
		}
	}
}
