package benchmark_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

// benchStores are the stores a pipeline benchmark runs on, each a migrated
// fleet of its own: PostgreSQL on a database of the benchmark's, SQLite on
// a file in its temporary directory.
var benchStores = []struct {
	name string
	open func(b *testing.B) benchmark.Store
}{
	{"postgres", func(b *testing.B) benchmark.Store { return setup(b, 0).store }},
	{"sqlite", func(b *testing.B) benchmark.Store {
		ctx := context.Background()
		s, err := sqlite.New(ctx, filepath.Join(b.TempDir(), "fleet.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		if _, err := s.Migrate(ctx, 0); err != nil {
			b.Fatal(err)
		}
		return s
	}},
}

// BenchmarkPipelineChain runs a chain of b.N no-op steps on one node with
// default settings and reports the time from each step's end to the next
// step's start (the release happens in the write that ends a step; the
// start waits for the node's claim, woken by the notification), from the
// times the store recorded.
//
//	go test -run '^$' -bench PipelineChain -benchtime 1000x -count 3 ./benchmark/
func BenchmarkPipelineChain(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			ctx := context.Background()
			s := bs.open(b)
			n, err := node.New(s, node.Config{NodeID: "chain", AllBuckets: true, Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			n.Register("noop", func(context.Context, *task.Task) error { return nil })
			if err := n.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = n.Shutdown(context.Background()) }()
			client, err := flotilla.NewClient(ctx, s)
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
			p, err := client.SubmitPipeline(ctx, flotilla.PipelineRequest{Name: "chain", Key: "chain", Steps: steps})
			if err != nil {
				b.Fatal(err)
			}
			last := p.Steps[len(p.Steps)-1].Task.ID
			deadline := time.Now().Add(patience.Scale(10 * time.Minute))
			for {
				t, err := s.GetTask(ctx, last)
				if err != nil {
					b.Fatal(err)
				}
				if t.Status.Terminal() {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the chain's last step is still %s after 10 minutes", t.Status)
				}
				time.Sleep(10 * time.Millisecond) // polling for the chain's end, with its deadline
			}
			b.StopTimer()
			done, err := client.GetPipeline(ctx, p.ID)
			if err != nil {
				b.Fatal(err)
			}
			if done.Status() != store.PipelineSucceeded {
				b.Fatalf("the chain ended %s", done.Status())
			}
			var gaps []time.Duration
			for i := 1; i < len(done.Steps); i++ {
				gaps = append(gaps, done.Steps[i].Task.StartedAt.Sub(done.Steps[i-1].Task.FinishedAt))
			}
			pc := benchmark.PercentilesOf(gaps)
			b.ReportMetric(float64(pc.P50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(pc.P99.Microseconds())/1000, "p99-ms")
		})
	}
}

// BenchmarkPipelineFanOut burns down, on one node holding every bucket, b.N
// no-op tasks three ways, alternating within one run: plain tasks spread
// over the buckets (the plain burn-down), plain tasks all in one bucket (the
// placement of a pipeline), and a pipeline of one root step, b.N steps
// that depend on it and one fan-in step that depends on all of them. The
// clock runs from the node's start to the last success; tasks/s is
// comparable between the three (the pipeline's two extra steps are
// counted).
//
//	go test -run '^$' -bench PipelineFanOut -benchtime 10000x -count 3 ./benchmark/
func BenchmarkPipelineFanOut(b *testing.B) {
	for _, bs := range benchStores {
		for _, shape := range []string{"plain-spread", "plain-one-bucket", "fan-out-fan-in"} {
			b.Run(bs.name+"/"+shape, func(b *testing.B) {
				ctx := context.Background()
				s := bs.open(b)
				jobs := b.N
				switch shape {
				case "plain-spread":
					if _, err := benchmark.Insert(ctx, s, b.N, 10_000, nil); err != nil {
						b.Fatal(err)
					}
				case "plain-one-bucket":
					nts := make([]store.NewTask, b.N)
					for i := range nts {
						nts[i] = store.NewTask{Kind: benchmark.Kind, Key: "fan", Bucket: 7}
					}
					for len(nts) > 0 {
						k := min(len(nts), 10_000)
						if _, err := s.CreateTasks(ctx, nts[:k]); err != nil {
							b.Fatal(err)
						}
						nts = nts[k:]
					}
				default:
					steps := []task.Step{{Name: "root", Kind: benchmark.Kind}}
					in := task.Step{Name: "in", Kind: benchmark.Kind}
					for i := range b.N {
						name := fmt.Sprintf("s%d", i)
						steps = append(steps, task.Step{Name: name, Kind: benchmark.Kind, DependsOn: []task.Dependency{{Step: "root"}}})
						in.DependsOn = append(in.DependsOn, task.Dependency{Step: name})
					}
					if _, err := s.CreatePipeline(ctx, store.NewPipeline{Name: "fan", Key: "fan", Steps: append(steps, in)}); err != nil {
						b.Fatal(err)
					}
					jobs += 2
				}
				b.ResetTimer()
				r, err := benchmark.BurnDown(ctx, s, jobs, node.Config{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(r.JobsPerSecond(), "tasks/s")
			})
		}
	}
}
