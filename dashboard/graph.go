package dashboard

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The pipeline graph is drawn on the server as SVG: steps in columns by
// depth (a step stands right of every step it depends on), edges as curves
// styled by their policy. No script draws it, so the page's Content
// Security Policy stays as strict as every other page's.
const (
	graphMaxSteps = 300 // beyond, the page shows the table alone
	nodeW         = 180.0
	nodeH         = 46.0
	colGap        = 70.0
	rowGap        = 16.0
	graphPad      = 10.0
	maxNameChars  = 24
)

type graph struct {
	Width, Height float64
	Nodes         []graphNode
	Edges         []graphEdge
}

type graphNode struct {
	Step   string
	Label  string
	Status task.Status
	Detail string // the state and time, on the node's second line
	Title  string
	TaskID int64
	X, Y   float64
	TX, TY float64 // where the name starts
	DY     float64 // where the detail line starts
}

type graphEdge struct {
	Path   string
	Policy string
	Title  string
	LX, LY float64 // where a policy other than success is written
}

// layoutGraph places the steps of p; nil when p has too many to draw.
func layoutGraph(p store.Pipeline, now time.Time) *graph {
	if len(p.Steps) == 0 || len(p.Steps) > graphMaxSteps {
		return nil
	}
	index := map[string]int{}
	for i, s := range p.Steps {
		index[s.Name] = i
	}
	// Depth: the longest path from a step without dependencies. Steps are
	// stored after the steps they depend on, but a retry or an append may
	// add one later: the depth is computed, not assumed from the order.
	depth := make([]int, len(p.Steps))
	done := make([]bool, len(p.Steps))
	var depthOf func(i int) int
	depthOf = func(i int) int {
		if done[i] {
			return depth[i]
		}
		done[i] = true // a cycle cannot be stored; this only stops one
		d := 0
		for _, dep := range p.Steps[i].DependsOn {
			if j, ok := index[dep.Step]; ok {
				d = max(d, depthOf(j)+1)
			}
		}
		depth[i] = d
		return d
	}
	maxDepth := 0
	for i := range p.Steps {
		maxDepth = max(maxDepth, depthOf(i))
	}
	// Rows within a column: by the mean row of the dependencies (fewer
	// crossings), then in the pipeline's order.
	columns := make([][]int, maxDepth+1)
	for i := range p.Steps {
		columns[depth[i]] = append(columns[depth[i]], i)
	}
	row := make([]float64, len(p.Steps))
	for c, col := range columns {
		key := make(map[int]float64, len(col))
		for _, i := range col {
			key[i] = float64(i)
			if c > 0 && len(p.Steps[i].DependsOn) > 0 {
				sum, n := 0.0, 0
				for _, dep := range p.Steps[i].DependsOn {
					if j, ok := index[dep.Step]; ok {
						sum += row[j]
						n++
					}
				}
				if n > 0 {
					key[i] = sum/float64(n)*1e6 + float64(i)
				}
			}
		}
		sort.SliceStable(col, func(a, b int) bool { return key[col[a]] < key[col[b]] })
		for r, i := range col {
			row[i] = float64(r)
		}
	}
	g := &graph{}
	maxRows := 0
	for _, col := range columns {
		maxRows = max(maxRows, len(col))
	}
	g.Width = graphPad*2 + float64(len(columns))*nodeW + float64(len(columns)-1)*colGap
	g.Height = graphPad*2 + float64(maxRows)*nodeH + float64(maxRows-1)*rowGap
	pos := make([][2]float64, len(p.Steps))
	for i, s := range p.Steps {
		x := graphPad + float64(depth[i])*(nodeW+colGap)
		y := graphPad + row[i]*(nodeH+rowGap)
		pos[i] = [2]float64{x, y}
		t := s.Task
		detail := string(t.Status)
		if d := took(now, t); d != "" {
			detail += " · " + d
		}
		if s.Tries > 1 {
			detail += fmt.Sprintf(" · try %d", s.Tries)
		}
		title := fmt.Sprintf("step %s: task %d, %s, attempt %d of %d", s.Name, t.ID, t.Status, t.Attempt, t.MaxAttempts)
		if why := skippedBecause(p, s); why != "" {
			title += "\n" + why
		}
		g.Nodes = append(g.Nodes, graphNode{Step: s.Name, Label: clip(s.Name, maxNameChars), Status: t.Status,
			Detail: detail, Title: title, TaskID: t.ID, X: x, Y: y, TX: x + 10, TY: y + 19, DY: y + 36})
	}
	for i, s := range p.Steps {
		for _, dep := range s.DependsOn {
			j, ok := index[dep.Step]
			if !ok {
				continue
			}
			x1, y1 := pos[j][0]+nodeW, pos[j][1]+nodeH/2
			x2, y2 := pos[i][0], pos[i][1]+nodeH/2
			mid := (x1 + x2) / 2
			g.Edges = append(g.Edges, graphEdge{
				Path:   fmt.Sprintf("M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f", x1, y1, mid, y1, mid, y2, x2-4, y2),
				Policy: dep.Policy(),
				Title:  fmt.Sprintf("%s → %s: runs on %s", dep.Step, s.Name, dep.Policy()),
				LX:     mid, LY: (y1+y2)/2 - 3,
			})
		}
	}
	return g
}

// skippedBecause says which dependency of a skipped step ended how, read
// from the steps' current tasks.
func skippedBecause(p store.Pipeline, s store.PipelineStep) string {
	if s.Task.Status != task.Skipped {
		return ""
	}
	for _, d := range s.DependsOn {
		dep, ok := p.Step(d.Step)
		if ok && dep.Task.Status.Terminal() && !task.Accepts(d.Policy(), dep.Task.Status) {
			return store.DependencyEndReason(d.Step, dep.Task.Status, d.Policy())
		}
	}
	return ""
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return strings.TrimSpace(string(r[:n-1])) + "…"
}
