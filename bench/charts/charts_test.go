package charts

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sampleComparison is two runs of every PostgreSQL workload of both
// systems, as cmd/compare records them.
func sampleComparison() *Comparison {
	c := &Comparison{Format: ComparisonFormat, Taken: "2026-12-01T22:00:00Z", Machine: map[string]string{"cpu": "test"}}
	tput := func(bench, system, settings string, v float64) {
		for run := range 2 {
			c.Results = append(c.Results, Result{Benchmark: bench, System: system, Settings: settings, N: 1000,
				Metrics: map[string]float64{"jobs/s": v + float64(run)}})
		}
	}
	tput("BulkInsert", "flotilla", "", 100_000)
	tput("BulkInsert", "river", "", 85_000)
	tput("BulkInsertMany", "river", "", 63_000)
	tput("BurnDown", "flotilla", "best", 29_000)
	tput("BurnDown", "river", "best", 24_000)
	tput("BurnDown", "flotilla", "default", 17_000)
	tput("BurnDown", "river", "default", 990)
	lat := func(bench, system, settings string, p50 float64) {
		c.Results = append(c.Results, Result{Benchmark: bench, System: system, Settings: settings, N: 100,
			Metrics: map[string]float64{"p50-ms": p50, "p90-ms": 2 * p50, "p99-ms": 5 * p50, "max-ms": 9 * p50}})
	}
	for _, b := range []string{"StartLatency", "IdlePickup", "Cancel"} {
		lat(b, "flotilla", "default", 2.6)
		lat(b, "river", "best", 3.0)
		lat(b, "river", "default", 54)
	}
	return c
}

func sampleSeries() *Series {
	return &Series{
		Format: SeriesFormat, Chart: "claim-cost-nodes", Title: "Claim cost against nodes",
		X: Axis{Label: "nodes", Log: true}, Y: Axis{Label: "µs per task"}, Source: "go test -bench X",
		Lines: []Curve{
			{Name: "time per task", Points: []Point{{2, 39.8}, {16, 54.2}, {64, 60}}},
			{Name: "database CPU per task", Points: []Point{{2, 64}, {16, 94}}},
		},
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// svgTexts parses an SVG document and returns the text it draws; it fails
// the test unless the document is well-formed XML whose root is <svg>.
func svgTexts(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var root string
	var texts strings.Builder
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not valid XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = tok.Name.Local
			}
			depth++
		case xml.EndElement:
			depth--
		case xml.CharData:
			texts.Write(tok)
			texts.WriteByte('\n')
		}
	}
	if root != "svg" || depth != 0 {
		t.Fatalf("%s: root element %q, depth at the end %d; want a closed <svg> document", path, root, depth)
	}
	return texts.String()
}

func TestRenderDrawsEveryChartThatHasDataAsValidSVG(t *testing.T) {
	data, out := t.TempDir(), t.TempDir()
	writeJSON(t, filepath.Join(data, ComparisonFileName), sampleComparison())
	writeJSON(t, filepath.Join(data, "claim-nodes.json"), sampleSeries())

	written, err := Render(data, out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range written {
		names = append(names, filepath.Base(w))
	}
	// No SQLite results: no SQLite chart.
	want := []string{"throughput.svg", "latency-start.svg", "latency-idle.svg", "latency-cancel.svg", "claim-cost-nodes.svg"}
	if !slices.Equal(names, want) {
		t.Fatalf("wrote %v, want %v", names, want)
	}
	for name, mustSay := range map[string][]string{
		"throughput.svg":       {"Throughput on PostgreSQL", "bulk insert", "burn-down, defaults", "flotilla", "River (InsertMany; defaults)"},
		"latency-start.svg":    {"1,000 single inserts/s", "p50", "p99", "max", "River, best settings"},
		"latency-cancel.svg":   {"context cancelled", "flotilla, defaults"},
		"claim-cost-nodes.svg": {"Claim cost against nodes", "nodes", "database CPU per task"},
	} {
		texts := svgTexts(t, filepath.Join(out, name))
		for _, s := range mustSay {
			if !strings.Contains(texts, s) {
				t.Errorf("%s does not show %q; its text:\n%s", name, s, texts)
			}
		}
	}
}

func TestAWorkloadWithoutBothSystemsIsLeftOut(t *testing.T) {
	c := &Comparison{Format: ComparisonFormat}
	for _, r := range sampleComparison().Results {
		// flotilla's burn-downs only, and every latency of River only.
		if (r.Benchmark == "BurnDown" && r.System == "flotilla") || (r.System == "river" && strings.HasSuffix(r.Benchmark, "Latency")) {
			c.Results = append(c.Results, r)
		}
	}
	cs, err := Draw(&Data{Comparison: c})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 0 {
		t.Errorf("drew %d charts from one-sided data (first %s), want none", len(cs), cs[0].Name)
	}
}

func TestMergeReplacesOnlyTheBenchmarksMeasuredAgain(t *testing.T) {
	saved := sampleComparison()
	next := &Comparison{Format: ComparisonFormat, Taken: "later", Results: []Result{
		{Benchmark: "Cancel", System: "flotilla", Settings: "default", N: 10, Metrics: map[string]float64{"p50-ms": 1}},
	}}
	saved.Merge(next)
	if got, _ := saved.Median("Cancel/system=flotilla/settings=default", "p50-ms"); got != 1 {
		t.Errorf("flotilla's cancel p50 after the merge: %v, want the new run's 1", got)
	}
	if got, _ := saved.Median("Cancel/system=river/settings=default", "p50-ms"); got != 54 {
		t.Errorf("River's cancel p50 after the merge: %v, want the saved 54", got)
	}
	if got, _ := saved.Median("BurnDown/system=flotilla/settings=best", "jobs/s"); got != 29_000.5 {
		t.Errorf("flotilla's burn-down after the merge: %v, want the saved median 29000.5", got)
	}
	if saved.Taken != "later" {
		t.Errorf("taken %q after the merge, want the new run's", saved.Taken)
	}
}

func TestBadDataFilesAreRefusedByName(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Series)
		want string
	}{
		"format":        {func(s *Series) { s.Format = "other/9" }, `format "other/9"`},
		"chart name":    {func(s *Series) { s.Chart = "../x" }, `chart "../x"`},
		"no series":     {func(s *Series) { s.Lines = nil }, "no series"},
		"zero on a log": {func(s *Series) { s.Lines[0].Points[0].X = 0 }, "point (0, 39.8) on a log scale"},
		"empty series":  {func(s *Series) { s.Lines[1].Points = nil }, `series "database CPU per task" has no points`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := sampleSeries()
			tc.edit(s)
			writeJSON(t, filepath.Join(dir, "bad.json"), s)
			_, err := ReadDir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.json") {
				t.Errorf("ReadDir: %v, want an error naming bad.json and %q", err, tc.want)
			}
		})
	}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, ComparisonFileName), &Comparison{Format: "flotilla-compare/0"})
	if _, err := ReadDir(dir); err == nil || !strings.Contains(err.Error(), `format "flotilla-compare/0"`) {
		t.Errorf("ReadDir of an old comparison file: %v, want its format named", err)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 16: "16", 1000: "1,000", 1_000_000: "1,000,000", -12345.5: "-12,345.5"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

// tableSizeSeries is a table-size curve file as BenchmarkSustainedRetention
// writes it (benchmark.WriteSizeCurves): MB over seconds for each run.
func tableSizeSeries() *Series {
	var off, on, vacuum []Point
	for s := 10.0; s <= 180; s += 10 {
		off = append(off, Point{s, 2 * s})
		on = append(on, Point{s, min(2*s, 60)})
		vacuum = append(vacuum, Point{s, min(2*s, 45)})
	}
	return &Series{
		Format: SeriesFormat, Chart: "table-size", Title: "Task and event tables on disk under a steady 500 tasks/s",
		X: Axis{Label: "seconds since the load started"}, Y: Axis{Label: "MB: task table, its indexes and the event table"},
		Source: "go test -bench SustainedRetention",
		Lines: []Curve{
			{Name: "retention off", Points: off},
			{Name: "retention on (20 s, a pass every 5 s)", Points: on},
			{Name: "retention on, VACUUM at each sample", Points: vacuum},
		},
	}
}

func TestTheTableSizeCurvesDrawEveryRunOverTime(t *testing.T) {
	data, out := t.TempDir(), t.TempDir()
	writeJSON(t, filepath.Join(data, "table-size.json"), tableSizeSeries())
	written, err := Render(data, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 1 || filepath.Base(written[0]) != "table-size.svg" {
		t.Fatalf("wrote %v, want table-size.svg alone", written)
	}
	texts := svgTexts(t, written[0])
	for _, s := range []string{"steady 500 tasks/s", "seconds since the load started", "MB: task table",
		"retention off", "retention on (20 s, a pass every 5 s)", "retention on, VACUUM at each sample"} {
		if !strings.Contains(texts, s) {
			t.Errorf("table-size.svg does not show %q; its text:\n%s", s, texts)
		}
	}
	// Seconds and megabytes are labelled as whole numbers, both from 0.
	if strings.Contains(texts, ".00") || strings.Count(texts, "\n0\n") != 2 {
		t.Errorf("table-size.svg's ticks are not whole numbers from 0; its text:\n%s", texts)
	}
}

// The saved data of docs/charts/data is what `make charts` draws: every
// file there must read and draw, the table-size curves included.
func TestTheSavedChartDataDraws(t *testing.T) {
	d, err := ReadDir(filepath.Join("..", "..", "docs", "charts", "data"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := Draw(d)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	for _, want := range []string{"table-size", "table-size-rows"} {
		if !slices.Contains(names, want) {
			t.Errorf("the saved data draws %v: no %s", names, want)
		}
	}
}
