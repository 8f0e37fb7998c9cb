package benchmark_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
// With FLOTILLA_CHART_DATA naming a directory (docs/charts/data), the last
// op of each variant is also saved there as the curves of the table-size
// charts (benchmark.WriteSizeCurves), which `make charts` then draws;
// without it nothing is written.
//
//	FLOTILLA_CHART_DATA=$PWD/docs/charts/data go test -run '^$' -bench SustainedRetention -benchtime 1x -timeout 30m -v ./benchmark/
func BenchmarkSustainedRetention(b *testing.B) {
	const sustainedRate = 5000 // tasks a second, the rate the retention target names
	chartData := os.Getenv("FLOTILLA_CHART_DATA")
	// Refuse a wrong directory before ten minutes of load, not after.
	if err := checkChartData(chartData); err != nil {
		b.Fatal(err)
	}
	var runs []benchmark.SizeRun
	on := store.Retention{Ages: store.Ages{"succeeded": 20 * time.Second}}
	for _, c := range []struct {
		name   string
		curve  string
		ret    store.Retention
		vacuum bool
	}{
		{"retention=off", "retention off", store.KeepForever(), false},
		{"retention=on", "retention on (20 s, a pass every 5 s)", on, false},
		{"retention=on/vacuum=each_sample", "retention on, VACUUM at each sample", on, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := range b.N {
				tb := setup(b, 64)
				samples, err := benchmark.Sustained(tb.ctx, tb.store, tb.store.Pool(), benchmark.SustainedConfig{
					Rate: sustainedRate, Duration: 3 * time.Minute, Sample: 10 * time.Second,
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
				if i == b.N-1 {
					runs = append(runs, benchmark.SizeRun{Name: c.curve, Samples: samples})
				}
			}
		})
	}
	if chartData != "" && len(runs) > 0 {
		source := fmt.Sprintf("FLOTILLA_CHART_DATA=docs/charts/data go test -run '^$' -bench SustainedRetention -benchtime 1x "+
			"-timeout 30m -v ./benchmark/, %s (docs/benchmarks.md, 'Retention: table sizes under a steady load')",
			time.Now().UTC().Format("2006-01-02"))
		if err := benchmark.WriteSizeCurves(chartData, fmt.Sprintf("a steady %d tasks/s", sustainedRate), source, runs); err != nil {
			b.Fatal(err)
		}
		b.Logf("table-size curves written to %s", chartData)
	}
}

// checkChartData refuses a FLOTILLA_CHART_DATA that is set but names no
// directory.
func checkChartData(dir string) error {
	if dir == "" {
		return nil
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("FLOTILLA_CHART_DATA=%q: it must be an existing directory", dir)
	}
	return nil
}

func TestChartDataMustBeADirectoryWhenSet(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for in, ok := range map[string]bool{"": true, dir: true, file: false, filepath.Join(dir, "missing"): false} {
		if err := checkChartData(in); (err == nil) != ok {
			t.Errorf("checkChartData(%q) = %v, want ok=%v", in, err, ok)
		}
	}
}

func TestWriteSizeCurvesReplacesARunsCurveInPlaceAndKeepsTheOthers(t *testing.T) {
	dir := t.TempDir()
	run := func(name string, rows int64) benchmark.SizeRun {
		return benchmark.SizeRun{Name: name, Samples: []benchmark.SizeSample{
			{At: 10 * time.Second, Tasks: rows, TaskBytes: 1 << 20, TaskIndexBytes: 1 << 20, EventBytes: 1 << 19},
			{At: 20 * time.Second, Tasks: 2 * rows, TaskBytes: 2 << 20, TaskIndexBytes: 1 << 20, EventBytes: 1 << 20}}}
	}
	if err := benchmark.WriteSizeCurves(dir, "a steady load", "first", []benchmark.SizeRun{run("off", 100), run("on", 50)}); err != nil {
		t.Fatal(err)
	}
	if err := benchmark.WriteSizeCurves(dir, "a steady load", "second", []benchmark.SizeRun{run("off", 300)}); err != nil {
		t.Fatal(err)
	}
	type curves struct {
		Format, Chart, Title, Source string
		Series                       []struct {
			Name   string
			Points []struct{ X, Y float64 }
		}
	}
	read := func(file string) curves {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		var c curves
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	rows := read(benchmark.RowsCurveFile)
	if rows.Format != "flotilla-series/1" || rows.Chart != "table-size-rows" || rows.Source != "second" ||
		!strings.Contains(rows.Title, "a steady load") {
		t.Errorf("rows file: format %q chart %q source %q title %q", rows.Format, rows.Chart, rows.Source, rows.Title)
	}
	if len(rows.Series) != 2 || rows.Series[0].Name != "off" || rows.Series[1].Name != "on" {
		t.Fatalf("rows curves %+v, want off (measured again, in its place) then on", rows.Series)
	}
	if p := rows.Series[0].Points; len(p) != 2 || p[0].X != 10 || p[0].Y != 300 || p[1].Y != 600 {
		t.Errorf("off's rows %+v, want the second run's (10, 300), (20, 600)", p)
	}
	if p := rows.Series[1].Points; len(p) != 2 || p[0].Y != 50 {
		t.Errorf("on's rows %+v, want the first run's, kept", p)
	}
	size := read(benchmark.SizeCurveFile)
	if size.Chart != "table-size" || len(size.Series) != 2 || size.Series[0].Points[0].Y != 2.5 || size.Series[0].Points[1].Y != 4 {
		t.Errorf("size file: chart %q curves %+v, want off at 2.5 then 4 MB", size.Chart, size.Series)
	}

	// A file of the same name drawing another chart is not overwritten.
	other := filepath.Join(dir, benchmark.SizeCurveFile)
	if err := os.WriteFile(other, []byte(`{"format": "flotilla-series/1", "chart": "claim-cost-nodes"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := benchmark.WriteSizeCurves(dir, "a steady load", "third", []benchmark.SizeRun{run("off", 1)})
	if err == nil || !strings.Contains(err.Error(), "claim-cost-nodes") {
		t.Errorf("writing over another chart's file: %v, want a refusal naming it", err)
	}
	empty := t.TempDir()
	if err := benchmark.WriteSizeCurves(empty, "a steady load", "none", nil); err == nil {
		t.Error("writing no runs: no error, want a refusal")
	}
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }
