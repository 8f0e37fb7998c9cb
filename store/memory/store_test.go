package memory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	testBuckets = 4
	ttl         = 30 * time.Second
)

// clockStart is a fixed instant, so that tests are reproducible.
var clockStart = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// fixture is a migrated store on a manual clock.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	clock *clock.Manual
	s     *memory.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	clk := clock.NewManual(clockStart)
	s := memory.New(memory.WithClock(clk.Now))
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, err := s.Migrate(ctx, testBuckets); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: ctx, clock: clk, s: s}
}

func (f *fixture) create(nt ...store.NewTask) []*task.Task {
	f.t.Helper()
	for i := range nt {
		if nt[i].Kind == "" {
			nt[i].Kind = "noop"
		}
	}
	out, err := f.s.CreateTasks(f.ctx, nt)
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) hold(owner string, buckets ...int) []store.HeldBucket {
	f.t.Helper()
	leases, err := f.s.AcquireBuckets(f.ctx, store.AcquireRequest{Owner: owner, Node: owner, Buckets: bucket.Of(buckets...), TTL: ttl})
	if err != nil {
		f.t.Fatal(err)
	}
	var held []store.HeldBucket
	for _, l := range leases {
		if l.Held {
			held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
		}
	}
	return held
}

func (f *fixture) claim(owner string, held []store.HeldBucket, limit int) []*task.Task {
	f.t.Helper()
	got, err := f.s.ClaimTasks(f.ctx, store.ClaimRequest{Owner: owner, Node: owner, Buckets: held,
		Kinds: []string{"noop"}, Limit: limit, LeaseTTL: ttl})
	if err != nil {
		f.t.Fatal(err)
	}
	return got
}

func (f *fixture) get(id int64) *task.Task {
	f.t.Helper()
	got, err := f.s.GetTask(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return got
}

func TestTheManualClockDrivesEveryExpiry(t *testing.T) {
	f := newFixture(t)
	later := f.create(store.NewTask{Bucket: 1, Delay: 10 * time.Second})[0]
	if later.Status != task.Scheduled || !later.RunAt.Equal(clockStart.Add(10*time.Second)) {
		t.Fatalf("delayed task: %s at %v", later.Status, later.RunAt)
	}
	held := f.hold("a", 1)
	if got := f.claim("a", held, 10); len(got) != 0 {
		t.Fatalf("claimed before due: %v", got)
	}

	f.clock.Advance(10 * time.Second)
	running := f.claim("a", held, 10)
	if len(running) != 1 || !running[0].LeaseExpiresAt.Equal(f.clock.Now().Add(ttl)) {
		t.Fatalf("claim once due: %+v", running)
	}

	// The task lease runs out by the clock, and reconcile sees it.
	f.clock.Advance(ttl / 2)
	f.hold("a", 1) // renewed: the bucket stays a's under the same epoch
	f.clock.Advance(ttl / 2)
	expired, err := f.s.ExpiredTasks(f.ctx, held, 0)
	if err != nil || len(expired) != 1 {
		t.Fatalf("expired after the TTL: %v %v", expired, err)
	}

	// The bucket lease runs out by the clock: another owner takes it under
	// a new epoch, and the old attempt is fenced.
	f.clock.Advance(ttl)
	list, _ := f.s.ListBuckets(f.ctx)
	if list[1].Holder != "" {
		t.Errorf("an expired bucket lease lists holder %q", list[1].Holder)
	}
	heldB := f.hold("b", 1)
	if len(heldB) != 1 || heldB[0].Epoch != held[0].Epoch+1 {
		t.Fatalf("takeover: %+v", heldB)
	}
	out, _ := f.s.AdvanceActive(f.ctx, "a", []store.ActiveTransition{{Ref: running[0].Ref(), To: task.Succeeded}})
	if !errors.Is(out[0].Err, store.ErrFenced) {
		t.Errorf("completion after takeover: %+v", out[0])
	}

	// A node's liveness runs out by the clock too.
	node := store.NodeInfo{ID: "w", Incarnation: "w/1"}
	if err := f.s.RegisterNode(f.ctx, node, ttl); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(ttl)
	nodes, _ := f.s.ListNodes(f.ctx)
	if nodes[0].Alive {
		t.Error("a node past its TTL is alive")
	}
	if err := f.s.RegisterNode(f.ctx, store.NodeInfo{ID: "w", Incarnation: "w/2"}, ttl); err != nil {
		t.Errorf("replacing a dead incarnation: %v", err)
	}
}

func TestReturnedValuesAreCopies(t *testing.T) {
	f := newFixture(t)
	payload := json.RawMessage(`{"a":1}`)
	created := f.create(store.NewTask{Bucket: 1, Payload: payload})[0]
	payload[2] = 'X' // the caller reuses its buffer
	created.Payload[2] = 'Y'
	created.Status = task.Failed
	if got := f.get(created.ID); string(got.Payload) != `{"a":1}` || got.Status != task.Queued {
		t.Fatalf("the store changed with the caller's copies: %s %s", got.Payload, got.Status)
	}

	held := f.hold("a", 1)
	running := f.claim("a", held, 1)[0]
	result := json.RawMessage(`{"r":1}`)
	if _, err := f.s.AdvanceActive(f.ctx, "a", []store.ActiveTransition{{Ref: running.Ref(), To: task.Succeeded, Result: result}}); err != nil {
		t.Fatal(err)
	}
	result[2] = 'X'
	if got := f.get(created.ID); string(got.Result) != `{"r":1}` {
		t.Errorf("result changed with the caller's buffer: %s", got.Result)
	}

	kinds := []string{"noop"}
	if err := f.s.RegisterNode(f.ctx, store.NodeInfo{ID: "w", Incarnation: "w/1", Kinds: kinds}, ttl); err != nil {
		t.Fatal(err)
	}
	kinds[0] = "changed"
	nodes, _ := f.s.ListNodes(f.ctx)
	nodes[0].Kinds[0] = "changed too"
	if nodes, _ := f.s.ListNodes(f.ctx); nodes[0].Kinds[0] != "noop" {
		t.Errorf("node kinds changed with the caller's slice: %v", nodes[0].Kinds)
	}

	sc, err := f.s.UpsertSchedule(f.ctx, store.Schedule{Name: "s", Spec: "@every 1m", Kind: "noop", Payload: json.RawMessage(`{}`)}, store.UpsertCreate)
	if err != nil {
		t.Fatal(err)
	}
	sc.Payload[0] = 'X'
	if got, _ := f.s.GetSchedule(f.ctx, "s"); string(got.Payload) != `{}` {
		t.Errorf("schedule payload changed with a returned copy: %s", got.Payload)
	}
}

func TestANilPayloadReadsAsNull(t *testing.T) {
	f := newFixture(t)
	created := f.create(store.NewTask{Bucket: 1})[0]
	if string(created.Payload) != "null" {
		t.Errorf("payload %q, want null", created.Payload)
	}
}

func TestListenEndsWithItsContextAndWithClose(t *testing.T) {
	f := newFixture(t)

	ctx, cancel := context.WithCancel(f.ctx)
	byContext, err := f.s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	drain(t, byContext.C())

	byClose, err := f.s.Listen(f.ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	if err := byClose.Close(); err != nil {
		t.Fatal(err)
	}
	drain(t, byClose.C())
	if err := byClose.Close(); err != nil {
		t.Errorf("closing twice: %v", err)
	}

	// Closing a handle ends its subscriptions, and only its own.
	other := f.s.Handle()
	onOther, _ := other.Listen(f.ctx, store.TopicTasks)
	onOriginal, _ := f.s.Listen(f.ctx, store.TopicTasks)
	defer onOriginal.Close()
	other.Close()
	other.Close()
	drain(t, onOther.C())
	f.create(store.NewTask{Bucket: 2})
	if n := <-onOriginal.C(); n.Topic != store.TopicTasks || n.Payload != "2" {
		t.Errorf("notification %+v, want new tasks in bucket 2", n)
	}
	if _, err := other.GetTask(f.ctx, 1); !errors.Is(err, memory.ErrClosed) {
		t.Errorf("a closed handle answered: %v", err)
	}
}

// drain reads ch until it is closed, failing the test if it stays open.
func drain(t *testing.T, ch <-chan store.Notification) {
	t.Helper()
	timeout := time.After(patience.Scale(10 * time.Second))
	for {
		select {
		case _, open := <-ch:
			if !open {
				return
			}
		case <-timeout:
			t.Fatal("the subscription's channel was not closed")
		}
	}
}

func TestNotificationsReachOtherHandlesAndNeverBlock(t *testing.T) {
	f := newFixture(t)
	other := f.s.Handle()
	defer other.Close()
	sub, err := other.Listen(f.ctx, store.TopicTasks, store.TopicCommands)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	// Far more than the buffer holds, with nobody reading: writers go on.
	for i := 0; i < 1000; i++ {
		f.create(store.NewTask{Bucket: i % testBuckets}, store.NewTask{Bucket: 3, Delay: time.Hour})
	}
	if got := len(sub.C()); got != cap(sub.C()) {
		t.Errorf("%d notifications buffered, want a full buffer of %d", got, cap(sub.C()))
	}
	if n := <-sub.C(); n.Topic != store.TopicTasks || n.Payload != "0" {
		t.Errorf("first notification %+v, want only the due task's bucket 0", n)
	}
}

func TestConcurrentClaimersNeverShareATask(t *testing.T) {
	f := newFixture(t)
	const total = 2000
	batch := make([]store.NewTask, total)
	for i := range batch {
		batch[i] = store.NewTask{Kind: "noop", Bucket: i % testBuckets}
	}
	f.create(batch...)

	// Several owners on their own handles: each holds one bucket, and two
	// workers of each owner claim, complete and sometimes release.
	var mu sync.Mutex
	completed := map[int64]string{}
	var wg sync.WaitGroup
	for b := 0; b < testBuckets; b++ {
		owner := fmt.Sprintf("owner-%d", b)
		h := f.s.Handle()
		defer h.Close()
		held := f.hold(owner, b)
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					got, err := h.ClaimTasks(f.ctx, store.ClaimRequest{Owner: owner, Buckets: held, Kinds: []string{"noop"}, Limit: 7, LeaseTTL: ttl})
					if err != nil {
						t.Error(err)
						return
					}
					if len(got) == 0 {
						return
					}
					batch := make([]store.ActiveTransition, len(got))
					for i, c := range got {
						to := task.Succeeded
						if (n+i)%5 == 0 {
							to = task.Queued // released: claimed again later
						}
						batch[i] = store.ActiveTransition{Ref: c.Ref(), To: to}
					}
					out, err := h.AdvanceActive(f.ctx, owner, batch)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, o := range out {
						if o.Err != nil {
							t.Errorf("task %d: %v", o.ID, o.Err)
						}
						if o.Status == task.Succeeded {
							if prev, done := completed[o.ID]; done {
								t.Errorf("task %d completed twice, by %s and %s", o.ID, prev, owner)
							}
							completed[o.ID] = owner
						}
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(completed) != total {
		t.Errorf("%d tasks completed, want %d", len(completed), total)
	}
	for id, owner := range completed {
		if tk := f.get(id); owner != fmt.Sprintf("owner-%d", tk.Bucket) || tk.Attempt != 1 {
			t.Fatalf("task %d of bucket %d completed by %s at attempt %d", id, tk.Bucket, owner, tk.Attempt)
		}
	}
}

func TestEverythingButNowWaitsForMigrate(t *testing.T) {
	s := memory.New()
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Now(ctx); err != nil {
		t.Errorf("Now before Migrate: %v", err)
	}
	_, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop"}})
	var se *store.SchemaError
	if !errors.As(err, &se) || se.Database != 0 {
		t.Errorf("CreateTasks before Migrate: %v, want *store.SchemaError asking for a migration", err)
	}
}

func TestAnOlderSchemaIsMigrated(t *testing.T) {
	f := newFixture(t)
	f.s.SetSchemaVersion(0)
	var se *store.SchemaError
	if _, err := f.s.Meta(f.ctx); !errors.As(err, &se) || se.Database != 0 {
		t.Fatalf("Meta on an older schema: %v", err)
	}
	meta, err := f.s.Migrate(f.ctx, 0)
	if err != nil || meta.SchemaVersion != memory.SchemaVersion || meta.NumBuckets != testBuckets {
		t.Errorf("Migrate of an older schema: %+v %v", meta, err)
	}
}

func TestAPendingStopEndsAPausingTaskStopped(t *testing.T) {
	f := newFixture(t)
	f.create(store.NewTask{Bucket: 1})
	held := f.hold("a", 1)
	running := f.claim("a", held, 1)[0]
	out, _ := f.s.AdvanceActive(f.ctx, "a", []store.ActiveTransition{{Ref: running.Ref(), To: task.Pausing}})
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	if _, err := f.s.IssueCommand(f.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop}); err != nil {
		t.Fatal(err)
	}
	// The checkpoint arrives after the stop: the task was interrupted while
	// running, so it ends stopped, not paused to be resumed later.
	out, _ = f.s.AdvanceActive(f.ctx, "a", []store.ActiveTransition{{Ref: running.Ref(), To: task.Paused}})
	if out[0].Err != nil || out[0].Status != task.Stopped {
		t.Errorf("pausing -> paused with a stop pending: %+v, want stopped", out[0])
	}
	// A move no attempt can end in is still refused by the table.
	f.create(store.NewTask{Bucket: 1})
	other := f.claim("a", held, 1)[0]
	if _, err := f.s.IssueCommand(f.ctx, store.NewCommand{TaskID: other.ID, Kind: store.CommandStop}); err != nil {
		t.Fatal(err)
	}
	out, _ = f.s.AdvanceActive(f.ctx, "a", []store.ActiveTransition{{Ref: other.Ref(), To: task.Skipped}})
	var te *task.TransitionError
	if !errors.As(out[0].Err, &te) {
		t.Errorf("running -> skipped with a stop pending: %+v, want *task.TransitionError", out[0])
	}
}

func TestHooksRefuseWhatDoesNotExist(t *testing.T) {
	f := newFixture(t)
	queued := f.create(store.NewTask{Bucket: 1})[0]
	if err := f.s.ExpireTaskLease(queued.ID); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("expiring the lease of a queued task: %v", err)
	}
	if err := f.s.ExpireTaskLease(99); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("expiring a missing task: %v", err)
	}
	if err := f.s.ExpireBucketLease(testBuckets); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("expiring a bucket the fleet lacks: %v", err)
	}
	if err := f.s.ExpireNode("nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("expiring a missing node: %v", err)
	}
}
