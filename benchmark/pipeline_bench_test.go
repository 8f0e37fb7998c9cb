package benchmark_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// BenchmarkPipelineChain runs a chain of b.N no-op steps on one node with
// default settings and reports the time from each step's end to the next
// step's start (the release happens in the statement that ends a step; the
// start waits for the node's claim, woken by the notification), from the
// database's own timestamps.
//
//	go test -run '^$' -bench PipelineChain -benchtime 1000x -count 3 ./benchmark/
func BenchmarkPipelineChain(b *testing.B) {
	tb := setup(b, 0)
	n, err := node.New(tb.store, node.Config{NodeID: "chain", AllBuckets: true, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	n.Register("noop", func(context.Context, *task.Task) error { return nil })
	if err := n.Start(tb.ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = n.Shutdown(context.Background()) }()
	client, err := flotilla.NewClient(tb.ctx, tb.store)
	if err != nil {
		b.Fatal(err)
	}
	steps := make([]task.Step, b.N)
	for i := range steps {
		steps[i] = task.Step{Name: fmt.Sprintf("s%d", i), Kind: "noop"}
		if i > 0 {
			steps[i].DependsOn = []task.Dependency{{Step: steps[i-1].Name}}
		}
	}
	b.ResetTimer()
	p, err := client.SubmitPipeline(tb.ctx, flotilla.PipelineRequest{Name: "chain", Key: "chain", Steps: steps})
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var left int
		if err := tb.store.Pool().QueryRow(tb.ctx,
			`SELECT count(*) FROM flotilla_tasks WHERE pipeline_id = $1 AND status <> 'succeeded'`, p.ID).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d steps still unfinished after 10 minutes", left)
		}
		time.Sleep(10 * time.Millisecond) // polling for the chain's end, with its deadline
	}
	b.StopTimer()
	rows, err := tb.store.Pool().Query(tb.ctx,
		`SELECT started_at, finished_at FROM flotilla_tasks WHERE pipeline_id = $1 ORDER BY id`, p.ID)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var gaps []time.Duration
	var prevEnd time.Time
	for rows.Next() {
		var started, finished time.Time
		if err := rows.Scan(&started, &finished); err != nil {
			b.Fatal(err)
		}
		if !prevEnd.IsZero() {
			gaps = append(gaps, started.Sub(prevEnd))
		}
		prevEnd = finished
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	pc := benchmark.PercentilesOf(gaps)
	b.ReportMetric(float64(pc.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pc.P99.Microseconds())/1000, "p99-ms")
}
