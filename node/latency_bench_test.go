package node

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// The submit-to-start benchmarks run a node with default settings on a
// fresh PostgreSQL database, in this process, and measure the time from the
// call to Submit to the start of the task's handler.
//
//	go test -run '^$' -bench SubmitToStart -benchtime 2000x ./node/

// startLatencyNode starts a default node on a fresh database whose "work"
// handler reports the start time of each task, by key.
func startLatencyNode(b *testing.B) (*Node, *sync.Map, chan string) {
	b.Helper()
	ctx := context.Background()
	s, err := postgres.New(ctx, testdb.New(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, 0); err != nil {
		b.Fatal(err)
	}
	n, err := New(s, Config{AllBuckets: true, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	started := &sync.Map{}
	keys := make(chan string, 1<<16)
	n.Register("work", func(_ context.Context, t *task.Task) error {
		started.Store(t.Key, time.Now())
		keys <- t.Key
		return nil
	})
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n, started, keys
}

func reportPercentiles(b *testing.B, latencies []time.Duration) {
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	at := func(q float64) float64 {
		return float64(latencies[int(q*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.90), "p90-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// BenchmarkSubmitToStartIdle submits one task at a time to an idle node.
func BenchmarkSubmitToStartIdle(b *testing.B) {
	n, started, keys := startLatencyNode(b)
	ctx := context.Background()
	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := fmt.Sprintf("idle-%d", i)
		t0 := time.Now()
		if _, err := n.Submit(ctx, SubmitRequest{Kind: "work", Key: key}); err != nil {
			b.Fatal(err)
		}
		for got := <-keys; got != key; got = <-keys {
		}
		at, _ := started.Load(key)
		latencies = append(latencies, at.(time.Time).Sub(t0))
	}
	b.StopTimer()
	reportPercentiles(b, latencies)
}

// BenchmarkSubmitToStartAt1000PerSecond submits b.N single tasks paced at
// 1,000 a second (-benchtime 20000x is 20 s), each its own Submit, from a
// few concurrent submitters as an application's request handlers would.
func BenchmarkSubmitToStartAt1000PerSecond(b *testing.B) {
	n, started, keys := startLatencyNode(b)
	ctx := context.Background()
	submitted := &sync.Map{}
	work := make(chan int, 1024)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				key := fmt.Sprintf("paced-%d", i)
				submitted.Store(key, time.Now())
				if _, err := n.Submit(ctx, SubmitRequest{Kind: "work", Key: key}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	b.ResetTimer()
	tick := time.NewTicker(time.Millisecond)
	for i := 0; i < b.N; i++ {
		<-tick.C
		work <- i
	}
	tick.Stop()
	close(work)
	wg.Wait()
	for i := 0; i < b.N; i++ {
		select {
		case <-keys:
		case err := <-errs:
			b.Fatal(err)
		case <-time.After(time.Minute):
			b.Fatalf("only %d of %d tasks started", i, b.N)
		}
	}
	b.StopTimer()
	latencies := make([]time.Duration, 0, b.N)
	submitted.Range(func(k, v any) bool {
		at, ok := started.Load(k)
		if ok {
			latencies = append(latencies, at.(time.Time).Sub(v.(time.Time)))
		}
		return true
	})
	reportPercentiles(b, latencies)
}
