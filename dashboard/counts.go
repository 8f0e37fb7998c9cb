package dashboard

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The counts by kind and the charts are read at most once per countsEvery
// (the hour) and dayEvery (the day), whoever watches: the unfinished tasks
// from the claim and active indexes, the ended attempts from the per-minute
// counts that nodes write. No viewer makes the dashboard read the task
// table.
const (
	countsEvery = 5 * time.Second
	dayEvery    = time.Minute
	// dayBin is the width of one bar of the day's chart.
	dayBin = 10 * time.Minute
)

// countsView is the counts by kind and state, and the charts.
type countsView struct {
	Kinds []kindRow
	Hour  chart
	Day   chart
	// Rollup is false when no node wrote a count in the last day: nodes
	// that `worker run` starts write them; a node of the library's needs
	// rollup.Recorder.
	Rollup bool
}

// kindRow is one kind's line: its unfinished tasks by state, and its ended
// attempts of the last hour.
type kindRow struct {
	Kind      string
	Scheduled int
	Queued    int
	Retrying  int
	Running   int // running, stopping, pausing
	Succeeded int // attempts of the last hour
	Failed    int // failed, timed out or lost, last hour
	Retried   int // attempts that failed with attempts left, last hour
}

// counts reads, or shares, the counts and charts.
func (s *Server) counts(ctx context.Context) (countsView, error) {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	now := s.now()
	c := s.cache.counts
	if !s.cache.countsAt.IsZero() && now.Sub(s.cache.countsAt) < countsEvery {
		return c, nil
	}
	unfinished, err := s.cfg.Store.UnfinishedByKind(ctx)
	if err != nil {
		return countsView{}, err
	}
	hourFrom := now.Truncate(time.Minute).Add(-59 * time.Minute)
	hour, err := s.cfg.Store.MinuteCounts(ctx, hourFrom)
	if err != nil {
		return countsView{}, err
	}
	if c.Day.Bars == nil || now.Sub(s.cache.dayAt) >= dayEvery {
		dayFrom := now.Truncate(dayBin).Add(-24*time.Hour + dayBin)
		day, err := s.cfg.Store.MinuteCounts(ctx, dayFrom)
		if err != nil {
			return countsView{}, err
		}
		c.Day = makeChart(day, dayFrom, dayBin, 144, "the last day, per 10 minutes")
		c.Day.From = "24 h ago"
		c.Rollup = len(day) > 0
		s.cache.dayAt = now
	}
	c.Hour = makeChart(hour, hourFrom, time.Minute, 60, "the last hour, per minute")
	c.Hour.From = "60 min ago"
	c.Kinds = kindRows(unfinished, hour)
	s.cache.counts, s.cache.countsAt = c, now
	return c, nil
}

func kindRows(unfinished []store.KindCount, hour []store.MinuteCount) []kindRow {
	rows := map[string]*kindRow{}
	row := func(kind string) *kindRow {
		r := rows[kind]
		if r == nil {
			r = &kindRow{Kind: kind}
			rows[kind] = r
		}
		return r
	}
	for _, c := range unfinished {
		r := row(c.Kind)
		switch c.Status {
		case task.Scheduled:
			r.Scheduled += c.Count
		case task.Queued:
			r.Queued += c.Count
		case task.Retrying:
			r.Retrying += c.Count
		default:
			r.Running += c.Count
		}
	}
	for _, c := range hour {
		r := row(c.Kind)
		switch c.Status {
		case task.Succeeded:
			r.Succeeded += c.Count
		case task.Retrying:
			r.Retried += c.Count
		case task.Failed, task.TimedOut, task.Lost:
			r.Failed += c.Count
		}
	}
	out := make([]kindRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// chart is a bar chart of ended attempts, drawn as SVG by the page: each
// bar is the successes, with the failures stacked on them.
type chart struct {
	Caption   string
	From      string // the left end, in words
	Bars      []bar
	Max       int // the tallest bar's total
	Succeeded int
	Failed    int
	Width     int
	Height    int
}

type bar struct {
	X, W         float64
	OkY, OkH     float64
	FailY, FailH float64
	Title        string
}

const (
	chartWidth  = 720
	chartHeight = 90
)

// makeChart bins counts from from on into n bins of width each.
func makeChart(counts []store.MinuteCount, from time.Time, width time.Duration, n int, caption string) chart {
	ok, bad := make([]int, n), make([]int, n)
	c := chart{Caption: caption, Width: chartWidth, Height: chartHeight}
	for _, m := range counts {
		i := int(m.Minute.Sub(from) / width)
		if i < 0 || i >= n {
			continue
		}
		switch {
		case m.Status == task.Succeeded:
			ok[i] += m.Count
			c.Succeeded += m.Count
		case failure(m.Status):
			bad[i] += m.Count
			c.Failed += m.Count
		}
	}
	for i := range n {
		c.Max = max(c.Max, ok[i]+bad[i])
	}
	scale := 0.0
	if c.Max > 0 {
		scale = float64(chartHeight) / float64(c.Max)
	}
	w := float64(chartWidth) / float64(n)
	c.Bars = slices.Grow(c.Bars, n)
	for i := range n {
		okH, failH := float64(ok[i])*scale, float64(bad[i])*scale
		at := from.Add(time.Duration(i) * width).UTC()
		c.Bars = append(c.Bars, bar{
			X: float64(i) * w, W: max(w-1, 1),
			OkY: chartHeight - okH, OkH: okH,
			FailY: chartHeight - okH - failH, FailH: failH,
			Title: fmt.Sprintf("%s: %d succeeded, %d failed", at.Format("15:04Z"), ok[i], bad[i]),
		})
	}
	return c
}
