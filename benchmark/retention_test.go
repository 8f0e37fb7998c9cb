package benchmark_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
)

func TestSustainedLoadWithRetentionPrunesAndWithoutKeepsEverything(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			tb := setup(t, 64)
			ret := store.Retention{Ages: store.Ages{"succeeded": time.Second}}
			if keep {
				ret = store.KeepForever()
			}
			cfg := benchmark.SustainedConfig{Rate: 200, Duration: 6 * time.Second, Sample: 2 * time.Second,
				Node: node.Config{Retention: ret, PruneInterval: 300 * time.Millisecond}}
			samples, err := benchmark.Sustained(tb.ctx, tb.store, tb.store.Pool(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			last := samples[len(samples)-1]
			switch {
			case keep && last.Tasks != last.Done:
				t.Errorf("kept forever: %d rows for %d tasks done", last.Tasks, last.Done)
			case !keep && last.Tasks >= last.Done:
				t.Errorf("with a second's retention over %v: %d rows for %d tasks done; nothing was pruned",
					cfg.Duration, last.Tasks, last.Done)
			}
		})
	}
}

// BenchmarkSustainedRetention is the table-size curve of a scaled
// "24-hour-equivalent" run: a steady load of no-op tasks on one node, with
// retention (succeeded tasks kept 20 s, the default's 24 h scaled down
// 4,320 times; a pass every 5 s) against without, and with a VACUUM after
// each sample, as an autovacuum that keeps up would run. Each op is one run of
// the whole load; the samples are logged as CSV, for docs/benchmarks.md.
//
//	go test -run '^$' -bench SustainedRetention -benchtime 1x -timeout 30m -v ./benchmark/
func BenchmarkSustainedRetention(b *testing.B) {
	on := store.Retention{Ages: store.Ages{"succeeded": 20 * time.Second}}
	for _, c := range []struct {
		name   string
		ret    store.Retention
		vacuum bool
	}{
		{"retention=off", store.KeepForever(), false},
		{"retention=on", on, false},
		{"retention=on/vacuum=each_sample", on, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				tb := setup(b, 64)
				samples, err := benchmark.Sustained(tb.ctx, tb.store, tb.store.Pool(), benchmark.SustainedConfig{
					Rate: 500, Duration: 3 * time.Minute, Sample: 10 * time.Second,
					Node: node.Config{Retention: c.ret, PruneInterval: 5 * time.Second}, Vacuum: c.vacuum})
				if err != nil {
					b.Fatal(err)
				}
				var csv strings.Builder
				csv.WriteString("\nseconds,done,rows,dead_rows,vacuums,task_mb,task_index_mb,event_mb,claim_us_per_task\n")
				for _, s := range samples {
					fmt.Fprintf(&csv, "%.0f,%d,%d,%d,%d,%.1f,%.1f,%.1f,%.0f\n", s.At.Seconds(), s.Done, s.Tasks,
						s.DeadTasks, s.Vacuums, mb(s.TaskBytes), mb(s.TaskIndexBytes), mb(s.EventBytes),
						float64(s.ClaimPerTask.Microseconds()))
				}
				b.Log(csv.String())
				last := samples[len(samples)-1]
				b.ReportMetric(mb(last.TaskBytes+last.TaskIndexBytes+last.EventBytes), "final-MB")
				b.ReportMetric(float64(last.Tasks), "final-rows")
			}
		})
	}
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }
