package benchmark_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// BenchmarkIdleFleet measures what a fleet with nothing to do costs the
// database: 1,024 buckets over 2, 16 or 64 nodes in this process, no task,
// no schedule, watched for b.N seconds once every node holds its buckets.
// server-cpu-ms/s is the CPU time of the database's backends per second
// of the window; what every node's loops send when nothing happens grows
// with the fleet.
//
//	go test -run '^$' -bench IdleFleet -benchtime 10x ./benchmark/
func BenchmarkIdleFleet(b *testing.B) {
	for _, nodes := range []int{2, 16, 64} {
		b.Run(fmt.Sprintf("buckets=1024/nodes=%d", nodes), func(b *testing.B) {
			tb := setup(b, 1024, postgres.WithMaxConns(20))
			var started []*node.Node
			defer func() {
				for _, n := range started {
					_ = n.Shutdown(context.WithoutCancel(tb.ctx))
				}
			}()
			for i := range nodes {
				lo, hi := i*1024/nodes, (i+1)*1024/nodes-1
				set, err := bucket.ParseSet(fmt.Sprintf("%d-%d", lo, hi), 1024)
				if err != nil {
					b.Fatal(err)
				}
				n, err := node.New(tb.store, node.Config{NodeID: fmt.Sprintf("idle-%d", i), Buckets: set, Logger: zap.NewNop()})
				if err != nil {
					b.Fatal(err)
				}
				n.Register(benchmark.Kind, func(context.Context, *task.Task) error { return nil })
				if err := n.Start(tb.ctx); err != nil {
					b.Fatal(err)
				}
				started = append(started, n)
			}
			deadline := time.Now().Add(time.Minute)
			for _, n := range started {
				for len(n.Held()) < 1024/nodes {
					if time.Now().After(deadline) {
						b.Fatalf("node %s holds %d buckets after a minute", n.ID(), len(n.Held()))
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			before, err := benchmark.ReadBackendCPU(tb.ctx, tb.store.Pool())
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			window := time.Duration(b.N) * time.Second
			time.Sleep(window) // the measurement: what the idle fleet does meanwhile
			b.StopTimer()
			after, err := benchmark.ReadBackendCPU(tb.ctx, tb.store.Pool())
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(after.Since(before).Microseconds())/1000/window.Seconds(), "server-cpu-ms/s")
		})
	}
}
