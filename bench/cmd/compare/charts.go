package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bench/charts"
)

// checkChartsDir refuses a -charts directory that does not exist before
// anything is measured; its data/ subdirectory is made when missing.
func checkChartsDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("-charts %q: it must be an existing directory (docs/charts holds the published ones)", dir)
	}
	return os.MkdirAll(filepath.Join(dir, "data"), 0o755)
}

// comparison turns the results into the charts' data format.
func (r *results) comparison(dsn string) *charts.Comparison {
	c := &charts.Comparison{
		Format:  charts.ComparisonFormat,
		Taken:   time.Now().UTC().Format(time.RFC3339),
		Machine: map[string]string{"goos": runtime.GOOS, "goarch": runtime.GOARCH, "cores": fmt.Sprint(runtime.NumCPU())},
		Command: "go run ./cmd/compare " + strings.Join(os.Args[1:], " "),
	}
	if cpu := cpuModel(); cpu != "" {
		c.Machine["cpu"] = cpu
	}
	if dsn != "" {
		if v := serverVersion(dsn); v != "" {
			c.Machine["postgres"] = v
		}
	}
	for _, l := range r.lines {
		m := map[string]float64{}
		for _, x := range l.metrics {
			m[x.unit] = x.value
		}
		c.Results = append(c.Results, charts.Result{Benchmark: l.name, System: l.system, Settings: l.settings, N: l.n, Metrics: m})
	}
	return c
}

// saveCharts merges this run's results into dir/data/compare.json (the
// workloads measured again replace their saved figures, the others stay)
// and redraws every chart of dir from dir/data.
func saveCharts(dir, dsn string, r *results) ([]string, error) {
	data := filepath.Join(dir, "data")
	path := filepath.Join(data, charts.ComparisonFileName)
	saved, err := charts.ReadComparison(path)
	if err != nil {
		return nil, err
	}
	next := r.comparison(dsn)
	if saved == nil {
		saved = next
	} else {
		saved.Merge(next)
	}
	if err := charts.WriteComparison(path, saved); err != nil {
		return nil, err
	}
	return charts.Render(data, dir)
}
