package node

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/task"
)

// recordingMetrics is a Metrics that serves HTTP and remembers what it was
// told.
type recordingMetrics struct {
	nopMetrics
	mu       sync.Mutex
	claimed  int
	finished []Finished
	acquired int
}

func (m *recordingMetrics) Claimed(started []*task.Task, _ time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		m.claimed += len(started)
	}
}

func (m *recordingMetrics) Flushed(done []Finished, _ time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		m.finished = append(m.finished, done...)
	}
}

func (m *recordingMetrics) BucketLeasesTicked(acquired, _ int, _ error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acquired += acquired
}

func (m *recordingMetrics) Rescued(reconcile.Report) {}

func (m *recordingMetrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("recorded\n"))
}

func TestTheNodeTellsItsMetricsWhatItDidAndServesThem(t *testing.T) {
	b := setup(t)
	m := &recordingMetrics{}
	cfg := b.config(t, "metered", 0, 1, 2, 3)
	cfg.Metrics = m
	cfg.PollInterval = 10 * time.Millisecond
	n, err := New(b.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.Register("work", noop)
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	if got := n.ActiveByKind(); len(got) != 1 || got["work"] != 0 {
		t.Errorf("ActiveByKind of an idle node: %v, want work: 0", got)
	}
	tk, err := n.Submit(b.ctx, SubmitRequest{Kind: "work", Key: b.keysIn(bucket.Of(0, 1, 2, 3), 1)[0]})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience.Scale(10 * time.Second))
	for {
		m.mu.Lock()
		done := len(m.finished) == 1
		m.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome reported for task %d", tk.ID)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	m.mu.Lock()
	f, claimed, acquired := m.finished[0], m.claimed, m.acquired
	m.mu.Unlock()
	if f.Kind != "work" || f.From != task.Running || f.To != task.Succeeded || f.Fenced || f.Ran < 0 {
		t.Errorf("reported outcome %+v, want work running -> succeeded", f)
	}
	if claimed != 1 || acquired != 4 {
		t.Errorf("reported %d claimed and %d buckets acquired, want 1 and 4", claimed, acquired)
	}

	srv := httptest.NewServer(HealthHandler(n))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics with a Metrics that serves HTTP: %d", resp.StatusCode)
	}
}

func TestNoMetricsPathWithoutAMetricsHandler(t *testing.T) {
	b := setup(t)
	n, err := New(b.store, b.config(t, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(HealthHandler(n))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/metrics without metrics: %d, want 404", resp.StatusCode)
	}
}
