// Package charts draws the benchmark figures of docs/benchmarks.md as SVG
// from JSON data files: the side-by-side comparison with River that
// cmd/compare writes (ComparisonFile), and curves that other benchmarks
// write (SeriesFile). A chart is drawn only from data that exists; a
// workload with no results is left out rather than drawn empty.
package charts

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Format names of the data files, checked on reading so that a file of
// another shape is refused by name instead of drawn wrong.
const (
	ComparisonFormat = "flotilla-compare/1"
	SeriesFormat     = "flotilla-series/1"
)

// ComparisonFileName is the comparison's data file inside a data directory.
const ComparisonFileName = "compare.json"

// Comparison is the results of cmd/compare: every run of every workload of
// both systems.
type Comparison struct {
	Format string `json:"format"`
	// Taken is when the results were measured (RFC 3339, UTC).
	Taken string `json:"taken"`
	// Machine says where: CPU model, PostgreSQL version, cores.
	Machine map[string]string `json:"machine,omitempty"`
	// Command is the command line that measured them.
	Command string   `json:"command,omitempty"`
	Results []Result `json:"results"`
}

// Result is one run of one workload of one system: a Go benchmark line.
type Result struct {
	// Benchmark is the workload: BulkInsert, BulkInsertMany, BurnDown,
	// StartLatency, IdlePickup, Cancel (SQLite ones prefixed SQLite).
	Benchmark string `json:"benchmark"`
	System    string `json:"system"`             // flotilla or river
	Settings  string `json:"settings,omitempty"` // best, default, or none
	N         int    `json:"n"`
	// Metrics by unit: jobs/s for throughput, p50-ms, p90-ms, p99-ms and
	// max-ms for latencies, and the per-job costs.
	Metrics map[string]float64 `json:"metrics"`
}

// Key identifies a result's benchmark across runs.
func (r Result) Key() string {
	k := r.Benchmark + "/system=" + r.System
	if r.Settings != "" {
		k += "/settings=" + r.Settings
	}
	return k
}

// Median is the median of unit over every run of the benchmark named by
// key, and whether there was any.
func (c *Comparison) Median(key, unit string) (float64, bool) {
	var vs []float64
	for _, r := range c.Results {
		if v, ok := r.Metrics[unit]; ok && r.Key() == key {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	if len(vs)%2 == 0 {
		return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, true
	}
	return vs[len(vs)/2], true
}

// Merge replaces the results of every benchmark that next measured by
// next's, and keeps the others: a run of some workloads (compare -only)
// updates their figures and leaves the rest of the charts as they were.
func (c *Comparison) Merge(next *Comparison) {
	fresh := map[string]bool{}
	for _, r := range next.Results {
		fresh[r.Key()] = true
	}
	var kept []Result
	for _, r := range c.Results {
		if !fresh[r.Key()] {
			kept = append(kept, r)
		}
	}
	c.Results = append(kept, next.Results...)
	c.Format, c.Taken, c.Machine, c.Command = next.Format, next.Taken, next.Machine, next.Command
}

// Series is a curve chart: y against x for one or more named series, such
// as the claim cost against the nodes of a fleet or against the finished
// rows in the table, or the table size over time under retention.
type Series struct {
	Format string `json:"format"`
	// Chart names the SVG file drawn from it (Chart + ".svg"): lower
	// case letters, digits and dashes.
	Chart string `json:"chart"`
	Title string `json:"title"`
	X     Axis   `json:"x"`
	Y     Axis   `json:"y"`
	// Source is the command that measured the points, and when.
	Source string  `json:"source"`
	Lines  []Curve `json:"series"`
}

// Axis is an axis's label and scale.
type Axis struct {
	Label string `json:"label"`
	// Log draws the axis on a logarithmic scale; every value must then be
	// above zero.
	Log bool `json:"log,omitempty"`
}

// Curve is one named series of points.
type Curve struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
}

// Point is one measurement.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// Data is every data file of a directory.
type Data struct {
	Comparison *Comparison // nil when the directory has none
	Series     []*Series   // by file name
}

// ReadComparison reads a comparison file; a missing file is (nil, nil).
func ReadComparison(path string) (*Comparison, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c Comparison
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.Format != ComparisonFormat {
		return nil, fmt.Errorf("%s: format %q: a comparison file has format %q", path, c.Format, ComparisonFormat)
	}
	return &c, nil
}

// WriteComparison writes c to path, indented, so that a change of the
// figures reads as a diff.
func WriteComparison(path string, c *Comparison) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadSeries reads and checks a series file.
func ReadSeries(path string) (*Series, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Series
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

func (s *Series) check() error {
	if s.Format != SeriesFormat {
		return fmt.Errorf("format %q: a series file has format %q", s.Format, SeriesFormat)
	}
	if s.Chart == "" || strings.Trim(s.Chart, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return fmt.Errorf("chart %q: the chart's file name must be lower case letters, digits and dashes", s.Chart)
	}
	if len(s.Lines) == 0 {
		return fmt.Errorf("chart %s: no series", s.Chart)
	}
	for _, l := range s.Lines {
		if len(l.Points) == 0 {
			return fmt.Errorf("chart %s: series %q has no points", s.Chart, l.Name)
		}
		for _, p := range l.Points {
			if (s.X.Log && p.X <= 0) || (s.Y.Log && p.Y <= 0) {
				return fmt.Errorf("chart %s: series %q: point (%g, %g) on a log scale: values must be above 0", s.Chart, l.Name, p.X, p.Y)
			}
		}
	}
	return nil
}

// ReadDir reads the comparison file and every series file (*.json) of dir.
func ReadDir(dir string) (*Data, error) {
	var d Data
	c, err := ReadComparison(filepath.Join(dir, ComparisonFileName))
	if err != nil {
		return nil, err
	}
	d.Comparison = c
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	charts := map[string]string{}
	for _, f := range files {
		if filepath.Base(f) == ComparisonFileName {
			continue
		}
		s, err := ReadSeries(f)
		if err != nil {
			return nil, err
		}
		if other, dup := charts[s.Chart]; dup {
			return nil, fmt.Errorf("%s and %s both draw chart %s", other, f, s.Chart)
		}
		charts[s.Chart] = f
		d.Series = append(d.Series, s)
	}
	return &d, nil
}
