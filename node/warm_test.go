package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// slowWarmer is a store whose warm-up runs until it is let go or its
// context ends, as a warm-up of many connections on a busy database runs
// for a while.
type slowWarmer struct {
	store.Store
	began   chan struct{}
	letGo   chan struct{}
	ended   atomic.Bool
	endedBy atomic.Value // the context's error, when it ended the warm-up
}

func newSlowWarmer(s store.Store) *slowWarmer {
	return &slowWarmer{Store: s, began: make(chan struct{}), letGo: make(chan struct{})}
}

func (s *slowWarmer) Warm(ctx context.Context) error {
	close(s.began)
	defer s.ended.Store(true)
	select {
	case <-s.letGo:
		return nil
	case <-ctx.Done():
		s.endedBy.Store(ctx.Err())
		return ctx.Err()
	}
}

// TestANodeClaimsWhileItsStoreWarmsAndStartReturnsOnceWarm: a node warms
// its store as it starts, and claims without waiting for the warm-up's end
// (on PostgreSQL its statements wait only for a connection already ready);
// its Start returns once the store is warm.
func TestANodeClaimsWhileItsStoreWarmsAndStartReturnsOnceWarm(t *testing.T) {
	b := setup(t)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := newSlowWarmer(h)
	ran := make(chan int64, 1)
	cfg := b.config(t, "warming", span(0, 63)...)
	n := newNodeOn(t, s, cfg, map[string]Handler{
		"work": func(_ context.Context, tk *task.Task) error { ran <- tk.ID; return nil },
	})
	// Let the warm-up go before the node's shutdown, should the test end
	// early: a Start still waiting for it would hold the shutdown up.
	var letGo sync.Once
	release := func() { letGo.Do(func() { close(s.letGo) }) }
	t.Cleanup(release)
	tasks, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "work", Key: "k", Bucket: b.policy.Of("k")}})
	if err != nil {
		t.Fatal(err)
	}
	var returned atomic.Bool
	startErr := make(chan error, 1)
	go func() {
		err := n.Start(b.ctx)
		returned.Store(true)
		startErr <- err
	}()
	select {
	case <-s.began:
	case <-time.After(time.Minute):
		t.Fatal("the node did not warm its store as it started")
	}
	select {
	case id := <-ran:
		if id != tasks[0].ID {
			t.Fatalf("ran task %d, want %d", id, tasks[0].ID)
		}
	case <-time.After(time.Minute):
		t.Fatal("the node claimed nothing while its store was warming")
	}
	if returned.Load() {
		t.Fatal("Start returned before the store was warm")
	}
	release()
	select {
	case err := <-startErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Start did not return once the store was warm")
	}
	if s.endedBy.Load() != nil {
		t.Fatalf("the warm-up was cut short: %v", s.endedBy.Load())
	}
}

// TestAStartThatFailsEndsTheWarmUp: a start refused (here, a bucket the
// fleet does not have) cuts the warm-up short and leaves it not running.
func TestAStartThatFailsEndsTheWarmUp(t *testing.T) {
	b := setup(t)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := newSlowWarmer(h)
	cfg := b.config(t, "refused", 0)
	cfg.Buckets = bucket.Of(1000)
	n, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start(b.ctx)
	var rangeErr *bucket.RangeError
	if err == nil || !errors.As(err, &rangeErr) {
		t.Fatalf("Start with bucket 1000 of 64: %v, want a *bucket.RangeError", err)
	}
	if !s.ended.Load() {
		t.Fatal("Start failed and left the warm-up running")
	}
}
