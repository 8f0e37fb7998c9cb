package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// writeSignal tells, after each AdvanceActive, how many outcomes it wrote.
type writeSignal struct {
	*memory.Store
	written chan int
}

func (w *writeSignal) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	out, err := w.Store.AdvanceActive(ctx, owner, batch)
	w.written <- len(batch)
	return out, err
}

func (w *writeSignal) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	out, claimed, err := w.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
	w.written <- len(batch)
	return out, claimed, err
}

// BenchmarkLoneTask measures one task from Submit to its recorded outcome,
// and (write-wait-ns) how long its outcome waited between the handler's
// return and the end of the write: a lone completion must not wait for a
// batch to fill.
func BenchmarkLoneTask(b *testing.B) {
	tb := setup(b)
	ws := &writeSignal{Store: tb.store.Handle(), written: make(chan int, 1)}
	cfg := tb.config(b, "bench")
	cfg.Logger = zap.NewNop()
	n, err := New(ws, cfg)
	if err != nil {
		b.Fatal(err)
	}
	var returned atomic.Int64
	n.Register("work", func(context.Context, *task.Task) error {
		returned.Store(time.Now().UnixNano())
		return nil
	})
	if err := n.Start(tb.ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = n.Shutdown(context.Background()) }()

	var wait time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := n.Submit(tb.ctx, SubmitRequest{Kind: "work", Key: "k"}); err != nil {
			b.Fatal(err)
		}
		<-ws.written
		wait += time.Duration(time.Now().UnixNano() - returned.Load())
	}
	b.ReportMetric(float64(wait.Nanoseconds())/float64(b.N), "write-wait-ns")
}

// BenchmarkBacklog measures burning down a backlog with the default
// concurrency: ns/op is per task, and tasks/write how many outcomes one
// AdvanceActive carried on average.
func BenchmarkBacklog(b *testing.B) {
	tb := setup(b)
	ws := &writeSignal{Store: tb.store.Handle(), written: make(chan int, 1024)}
	cfg := tb.config(b, "bench")
	cfg.Logger = zap.NewNop()
	n, err := New(ws, cfg)
	if err != nil {
		b.Fatal(err)
	}
	n.Register("work", noop)
	reqs := make([]SubmitRequest, b.N)
	for i := range reqs {
		reqs[i] = SubmitRequest{Kind: "work", Key: fmt.Sprintf("k%d", i)}
	}
	for i := 0; i < len(reqs); i += 1000 {
		if _, err := n.SubmitMany(tb.ctx, reqs[i:min(i+1000, len(reqs))]); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	if err := n.Start(tb.ctx); err != nil {
		b.Fatal(err)
	}
	writes, done := 0, 0
	for done < b.N {
		done += <-ws.written
		writes++
	}
	b.StopTimer()
	_ = n.Shutdown(context.Background())
	b.ReportMetric(float64(b.N)/float64(writes), "tasks/write")
}
