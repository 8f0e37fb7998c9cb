package rollup

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flakyStore fails AddMinuteCounts while down.
type flakyStore struct {
	store.Store
	mu       sync.Mutex
	down     bool
	refusals int
}

func (f *flakyStore) AddMinuteCounts(ctx context.Context, nodeID string, c []store.MinuteCount) error {
	f.mu.Lock()
	down := f.down
	if down {
		f.refusals++
	}
	f.mu.Unlock()
	if down {
		return errors.New("the database is away")
	}
	return f.Store.AddMinuteCounts(ctx, nodeID, c)
}

// nextMetrics records what is passed on.
type nextMetrics struct {
	node.Metrics
	flushed, rescued, limits, served int
}

func (n *nextMetrics) Flushed([]node.Finished, time.Duration, error) { n.flushed++ }
func (n *nextMetrics) Rescued(reconcile.Report)                      { n.rescued++ }
func (n *nextMetrics) LimitsRefreshed([]node.LimitUse)               { n.limits++ }
func (n *nextMetrics) ServeHTTP(http.ResponseWriter, *http.Request)  { n.served++ }

// TestRecorderStandsWhereItsNextStood: the optional interfaces of the
// metrics it wraps (limits, /metrics) are passed on, or answered as absent.
func TestRecorderStandsWhereItsNextStood(t *testing.T) {
	next := &nextMetrics{}
	rec := New(nil, Options{Next: next})
	rec.LimitsRefreshed(nil)
	rec.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if next.limits != 1 || next.served != 1 {
		t.Errorf("passed on %d limit refreshes and %d requests, want 1 each", next.limits, next.served)
	}
	w := httptest.NewRecorder()
	New(nil, Options{}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("/metrics without a next: %d, want 404", w.Code)
	}
}

func TestRecorderCountsEndedAttemptsPerMinuteAndWritesThem(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	defer mem.Close()
	if _, err := mem.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	s := &flakyStore{Store: mem, down: true}
	var mu sync.Mutex
	clock := time.Now().UTC().Truncate(time.Minute).Add(10 * time.Second)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	next := &nextMetrics{}
	rec := New(s, Options{Next: next, Every: 10 * time.Millisecond, Now: now})
	rec.Flushed([]node.Finished{{Kind: "email", To: task.Succeeded}, {Kind: "email", To: task.Succeeded},
		{Kind: "email", To: task.Retrying}, {Kind: "email", To: task.Failed, Fenced: true}}, time.Millisecond, nil)
	mu.Lock()
	clock = clock.Add(time.Minute)
	mu.Unlock()
	rec.Rescued(reconcile.Report{Entries: []reconcile.Entry{{Kind: "report", To: task.Lost, Outcome: reconcile.OutcomeLost},
		{Kind: "report", To: task.Running, Outcome: reconcile.OutcomeConflict}}})
	if next.flushed != 1 || next.rescued != 1 {
		t.Errorf("passed on %d flushes and %d rescues, want 1 each", next.flushed, next.rescued)
	}
	if err := rec.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	defer rec.Stop()
	// The store is away: the counts wait. Then it comes back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		refused := s.refusals
		if refused > 0 {
			s.down = false
		}
		s.mu.Unlock()
		if refused > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write was tried while the store was away")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var got []store.MinuteCount
	for {
		var err error
		got, err = mem.MinuteCounts(ctx, clock.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	first := clock.Add(-time.Minute).Truncate(time.Minute)
	want := []store.MinuteCount{
		{Minute: first, Kind: "email", Status: task.Retrying, Count: 1},
		{Minute: first, Kind: "email", Status: task.Succeeded, Count: 2},
		{Minute: first.Add(time.Minute), Kind: "report", Status: task.Lost, Count: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("written %+v, want %+v", got, want)
	}
	for i := range want {
		if !got[i].Minute.Equal(want[i].Minute) || got[i].Kind != want[i].Kind || got[i].Status != want[i].Status || got[i].Count != want[i].Count {
			t.Errorf("count %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Stop writes what is left.
	rec.Flushed([]node.Finished{{Kind: "email", To: task.Succeeded}}, 0, nil)
	rec.Stop()
	got, _ = mem.MinuteCounts(ctx, clock.Add(-time.Hour))
	total := 0
	for _, c := range got {
		total += c.Count
	}
	if total != 5 {
		t.Errorf("after Stop %d attempts counted in all, want 5: %+v", total, got)
	}
	if err := New(mem, Options{}).Start(ctx, ""); err == nil {
		t.Error("Start without a node id: no error")
	}
}
