package charts

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The size of every chart.
const (
	width  = 6 * vg.Inch
	height = 3.6 * vg.Inch
)

// The colours of the systems: flotilla one, River another, and River's
// second variant (its defaults, or InsertMany) a lighter shade of its own.
var (
	flotillaColour   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	riverColour      = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	riverLightColour = color.RGBA{R: 0xf0, G: 0x9a, B: 0x9a, A: 0xff}
)

// bar is one system's bar in every group of a bar chart.
type bar struct {
	label  string
	colour color.Color
	keys   []string // per group, the benchmark key; "" when it has none
}

// group is a workload of a bar chart.
type group struct {
	label string
	unit  string
}

// throughputBars are the throughput workloads and, for each system, the
// benchmark that measures it: on PostgreSQL, or with sqlite on SQLite
// files, where River has no COPY and one burn-down.
func throughputBars(sqlite bool) ([]group, []bar) {
	if sqlite {
		return []group{{"bulk insert", "jobs/s"}, {"burn-down, best settings", "jobs/s"}},
			[]bar{
				{"flotilla", flotillaColour, []string{"SQLiteBulkInsert/system=flotilla", "SQLiteBurnDown/system=flotilla/settings=best"}},
				{"River (InsertMany; tuned fetch)", riverColour, []string{"SQLiteBulkInsert/system=river", "SQLiteBurnDown/system=river/settings=best"}},
			}
	}
	return []group{{"bulk insert", "jobs/s"}, {"burn-down, best settings", "jobs/s"}, {"burn-down, defaults", "jobs/s"}},
		[]bar{
			{"flotilla", flotillaColour, []string{
				"BulkInsert/system=flotilla", "BurnDown/system=flotilla/settings=best", "BurnDown/system=flotilla/settings=default"}},
			{"River (InsertManyFast; tuned fetch)", riverColour, []string{
				"BulkInsert/system=river", "BurnDown/system=river/settings=best", ""}},
			{"River (InsertMany; defaults)", riverLightColour, []string{
				"BulkInsertMany/system=river", "", "BurnDown/system=river/settings=default"}},
		}
}

// barChart draws the medians of the groups that have a figure for
// flotilla and for at least one River bar; nil when none has.
func barChart(c *Comparison, title, yLabel string, groups []group, bars []bar) (*plot.Plot, error) {
	var keep []int
	for g := range groups {
		_, flotilla := c.Median(bars[0].keys[g], groups[g].unit)
		river := false
		for _, b := range bars[1:] {
			if _, ok := c.Median(b.keys[g], groups[g].unit); ok {
				river = true
			}
		}
		if flotilla && river {
			keep = append(keep, g)
		}
	}
	if len(keep) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Tick.Marker = thousandsTicks{}
	p.Y.Min = 0
	p.Legend.Top = true
	names := make([]string, len(keep))
	for i, g := range keep {
		names[i] = groups[g].label
	}
	w := vg.Points(18)
	for bi, b := range bars {
		vs := make(plotter.Values, len(keep))
		any := false
		for i, g := range keep {
			if v, ok := c.Median(b.keys[g], groups[g].unit); ok {
				vs[i], any = v, true
			}
		}
		if !any {
			continue
		}
		bc, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return nil, err
		}
		bc.Color = b.colour
		bc.LineStyle.Width = 0
		bc.Offset = w * vg.Length(bi-len(bars)/2)
		p.Add(bc)
		p.Legend.Add(b.label, bc)
	}
	p.NominalX(names...)
	// Room above the tallest bar for the legend (p.Add widened the axes
	// to the data).
	p.Y.Max *= 1.35
	return p, nil
}

// latencyLine is one system's latency distribution.
type latencyLine struct {
	label  string
	colour color.Color
	dashed bool
	key    string
}

// quantiles are the points of a latency distribution, in order.
var quantiles = []struct{ label, unit string }{{"p50", "p50-ms"}, {"p90", "p90-ms"}, {"p99", "p99-ms"}, {"max", "max-ms"}}

// latencyChart draws each system's latency at p50, p90, p99 (and the
// maximum, when measured) on a log scale; nil unless flotilla and River
// both have figures.
func latencyChart(c *Comparison, benchmark, title string) (*plot.Plot, error) {
	lines := []latencyLine{
		{"flotilla, defaults", flotillaColour, false, benchmark + "/system=flotilla/settings=default"},
		{"River, best settings", riverColour, false, benchmark + "/system=river/settings=best"},
		{"River, defaults", riverLightColour, true, benchmark + "/system=river/settings=default"},
	}
	// The quantiles every line has.
	var qs []int
	for qi, q := range quantiles {
		all := true
		for _, l := range lines {
			if _, ok := c.Median(l.key, q.unit); !ok {
				if _, exists := c.Median(l.key, "p50-ms"); exists {
					all = false
				}
			}
		}
		if all {
			qs = append(qs, qi)
		}
	}
	_, flotilla := c.Median(lines[0].key, "p50-ms")
	_, riverBest := c.Median(lines[1].key, "p50-ms")
	_, riverDefault := c.Median(lines[2].key, "p50-ms")
	if !flotilla || !(riverBest || riverDefault) || len(qs) < 2 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "ms, log scale (medians of runs)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	var names []string
	for _, qi := range qs {
		names = append(names, quantiles[qi].label)
	}
	for _, l := range lines {
		var xys plotter.XYs
		for i, qi := range qs {
			v, ok := c.Median(l.key, quantiles[qi].unit)
			if !ok {
				break
			}
			xys = append(xys, plotter.XY{X: float64(i), Y: max(v, 0.001)})
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = l.colour, l.colour
		line.Width = vg.Points(1.5)
		if l.dashed {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(l.label, line, points)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.3, float64(len(qs)-1)+0.3
	// From the power of ten below the lowest point, so that the axis has a
	// labelled tick, to room above the highest for the legend (p.Add
	// widened the axes to the data).
	p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(p.Y.Min))), p.Y.Max*3
	return p, nil
}

// seriesChart draws a Series file.
func seriesChart(s *Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = s.Title
	p.X.Label.Text = s.X.Label
	p.Y.Label.Text = s.Y.Label
	if s.X.Log {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if s.Y.Log {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Tick.Marker = thousandsTicks{}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	colours := []color.Color{flotillaColour, riverColour, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}}
	for i, l := range s.Lines {
		xys := make(plotter.XYs, len(l.Points))
		for j, pt := range l.Points {
			xys[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %s, series %q: %w", s.Chart, l.Name, err)
		}
		c := colours[i%len(colours)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(l.Name, line, points)
	}
	if xs := distinctX(s); len(xs) <= 12 {
		// Few measured points: label the axis where they are.
		ticks := make(plot.ConstantTicks, len(xs))
		for i, x := range xs {
			ticks[i] = plot.Tick{Value: x, Label: thousands(x)}
		}
		p.X.Tick.Marker = ticks
		if s.X.Log {
			p.X.Min, p.X.Max = p.X.Min/1.3, p.X.Max*1.3
		} else {
			pad := (p.X.Max - p.X.Min) * 0.05
			p.X.Min, p.X.Max = p.X.Min-pad, p.X.Max+pad
		}
	} else if !s.X.Log {
		// Many points, such as samples over time: plot's default ticks
		// labelled like the y axis' (1,000), and the axis from 0 when
		// every x is positive, so that a curve over time starts where the
		// time does.
		p.X.Tick.Marker = thousandsTicks{}
		if p.X.Min > 0 {
			p.X.Min = 0
		}
	}
	if s.Y.Log {
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(p.Y.Min)))
	} else {
		p.Y.Min = 0
	}
	// Room above the highest point for the legend (p.Add widened the
	// axes to the data).
	if s.Y.Log {
		p.Y.Max *= 3
	} else {
		p.Y.Max *= 1.3
	}
	return p, nil
}

// Chart is one drawn chart.
type Chart struct {
	Name string // the SVG file's name without .svg
	Plot *plot.Plot
}

// Draw makes every chart that d has data for, in a fixed order: the
// comparison's, then the series files' in file order.
func Draw(d *Data) ([]Chart, error) {
	var out []Chart
	add := func(name string, p *plot.Plot, err error) error {
		if err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		if p != nil {
			out = append(out, Chart{name, p})
		}
		return nil
	}
	if c := d.Comparison; c != nil {
		g, b := throughputBars(false)
		p, err := barChart(c, "Throughput on PostgreSQL, flotilla and River", "jobs per second, medians over the runs", g, b)
		if err := add("throughput", p, err); err != nil {
			return nil, err
		}
		g, b = throughputBars(true)
		p, err = barChart(c, "Throughput on SQLite, flotilla and River", "jobs per second, medians over the runs", g, b)
		if err := add("throughput-sqlite", p, err); err != nil {
			return nil, err
		}
		for _, l := range []struct{ name, benchmark, title string }{
			{"latency-start", "StartLatency", "Submit to start at 1,000 single inserts/s"},
			{"latency-idle", "IdlePickup", "Submit to start, one at a time on an idle system"},
			{"latency-cancel", "Cancel", "Stop of a running task to its handler's context cancelled"},
		} {
			p, err := latencyChart(c, l.benchmark, l.title)
			if err := add(l.name, p, err); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range d.Series {
		p, err := seriesChart(s)
		if err := add(s.Chart, p, err); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// WriteSVG writes c as SVG.
func (c Chart) WriteSVG(w io.Writer) error {
	wt, err := c.Plot.WriterTo(width, height, "svg")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// Render draws every chart the data files of dataDir hold into outDir as
// NAME.svg, and returns the files written.
func Render(dataDir, outDir string) ([]string, error) {
	d, err := ReadDir(dataDir)
	if err != nil {
		return nil, err
	}
	cs, err := Draw(d)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, c := range cs {
		path := filepath.Join(outDir, c.Name+".svg")
		var b strings.Builder
		if err := c.WriteSVG(&b); err != nil {
			return written, fmt.Errorf("chart %s: %w", c.Name, err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// distinctX returns the x values of s's points, in order, once each.
func distinctX(s *Series) []float64 {
	var xs []float64
	for _, l := range s.Lines {
		for _, pt := range l.Points {
			if !slices.Contains(xs, pt.X) {
				xs = append(xs, pt.X)
			}
		}
	}
	slices.Sort(xs)
	return xs
}

// thousands formats v with a comma between thousands: 1,000,000.
func thousands(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	whole, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(whole, "-")
	whole = strings.TrimPrefix(whole, "-")
	var b strings.Builder
	for i, r := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	out := b.String()
	if frac != "" {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

// thousandsTicks are plot's default ticks, labelled with thousands(v).
type thousandsTicks struct{}

func (thousandsTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = thousands(ts[i].Value)
		}
	}
	return ts
}
