package benchmark_test

import (
	"fmt"
	"testing"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// BenchmarkBurnDownSpread burns down b.N no-op tasks on several nodes in
// this process that split the fleet's buckets between them and share one
// store, whose pool is capped at 20 connections (each node adds one for
// its notifications: 36 in all for 16 nodes, 84 for 64, under PostgreSQL's
// default max_connections of 100). Each node has the default concurrency.
// The work per task must cost about as much with 1,024 buckets over 16 or
// 64 nodes as with 64 over 2 (ns/op: one op is one task, from the first
// node's start to the last completion). claim-us/task is the time the
// nodes spent in ClaimTasks per task claimed, pool-wait-us/task the time
// every caller spent waiting for a pooled connection, per task.
//
//	go test -run '^$' -bench BurnDownSpread -benchtime 100000x -count 3 ./benchmark/
func BenchmarkBurnDownSpread(b *testing.B) {
	for _, c := range []struct{ buckets, nodes int }{{64, 2}, {1024, 16}, {1024, 64}} {
		b.Run(fmt.Sprintf("buckets=%d/nodes=%d", c.buckets, c.nodes), func(b *testing.B) {
			tb := setup(b, c.buckets, postgres.WithMaxConns(20))
			if _, err := benchmark.Insert(tb.ctx, tb.store, b.N, 10_000, nil); err != nil {
				b.Fatal(err)
			}
			acquired := tb.store.Pool().Stat().AcquireDuration()
			b.ResetTimer()
			r, err := benchmark.BurnDownSpread(tb.ctx, tb.store, b.N, c.nodes, node.Config{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(r.JobsPerSecond(), "tasks/s")
			b.ReportMetric(float64(r.Calls.ClaimPerTask().Nanoseconds())/1000, "claim-us/task")
			b.ReportMetric(float64(r.Calls.ClaimedTasks)/float64(r.Calls.Claims), "tasks/claim")
			// Outcomes per AdvanceActive: smaller batches mean more
			// statements, each with its transaction, per task.
			b.ReportMetric(float64(r.Calls.AdvancedTasks)/float64(r.Calls.Advances), "tasks/outcome-write")
			// Time spent waiting for a pooled connection, by every caller,
			// per task: the share of the claim time that is the shared
			// pool's queue rather than the database's work.
			wait := tb.store.Pool().Stat().AcquireDuration() - acquired
			b.ReportMetric(float64(wait.Nanoseconds())/1000/float64(b.N), "pool-wait-us/task")
			b.ReportMetric(float64(r.ServerCPU.Nanoseconds())/1000/float64(b.N), "server-cpu-us/task")
			b.ReportMetric(float64(r.ClientCPU.Nanoseconds())/1000/float64(b.N), "client-cpu-us/task")
		})
	}
}
