package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// SustainedConfig is a run of steady load: Rate no-op tasks a second,
// inserted in batches every tenth of a second, for Duration, run by one
// node in this process configured by Node (its Retention and PruneInterval
// decide whether, and how fast, finished tasks go). A sample of the tables'
// sizes is taken every Sample.
type SustainedConfig struct {
	Rate     int
	Duration time.Duration
	Sample   time.Duration
	Node     node.Config
	// Vacuum runs a plain VACUUM of the task and event tables after each
	// sample, as an autovacuum that keeps up would: the space of pruned
	// rows is then reused by new ones.
	Vacuum bool
}

// SizeSample is one reading during a sustained run.
type SizeSample struct {
	At    time.Duration // since the start of the load
	Tasks int64         // rows of flotilla_tasks
	// Bytes on disk: the task table's heap (with its TOAST), its indexes
	// together, and the event table with its indexes.
	TaskBytes, TaskIndexBytes, EventBytes int64
	// ClaimPerTask is the time the node spent in ClaimTasks per task
	// claimed since the previous sample.
	ClaimPerTask time.Duration
	// Done counts the tasks that succeeded so far.
	Done int64
	// DeadTasks is the task table's dead row versions, and Vacuums the
	// vacuums of it so far (autovacuum's and the run's), as
	// pg_stat_user_tables says.
	DeadTasks, Vacuums int64
}

const sizesSQL = `SELECT (SELECT count(*) FROM flotilla_tasks), pg_table_size('flotilla_tasks'),
	pg_indexes_size('flotilla_tasks'), pg_total_relation_size('flotilla_task_events'),
	n_dead_tup, vacuum_count + autovacuum_count
	FROM pg_stat_user_tables WHERE relname = 'flotilla_tasks'`

// Sustained runs cfg against s, whose database pool reads the sizes, and
// returns the samples, the last taken once the load has stopped and the
// node has drained.
func Sustained(ctx context.Context, s Store, pool *pgxpool.Pool, cfg SustainedConfig) ([]SizeSample, error) {
	if cfg.Rate <= 0 || cfg.Duration <= 0 || cfg.Sample <= 0 {
		return nil, errors.New("sustained run: Rate, Duration and Sample must be positive")
	}
	counting := newCountingStore(s)
	n, err := startNode(ctx, counting, cfg.Node, "noop", func(context.Context, *task.Task) error { return nil })
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = n.Shutdown(sctx)
	}()

	var out []SizeSample
	var last CallCounts
	sample := func(at time.Duration) error {
		var sm SizeSample
		sm.At = at
		if err := pool.QueryRow(ctx, sizesSQL).Scan(&sm.Tasks, &sm.TaskBytes, &sm.TaskIndexBytes, &sm.EventBytes,
			&sm.DeadTasks, &sm.Vacuums); err != nil {
			return fmt.Errorf("table sizes: %w", err)
		}
		if cfg.Vacuum {
			if _, err := pool.Exec(ctx, `VACUUM flotilla_tasks, flotilla_task_events`); err != nil {
				return fmt.Errorf("vacuum: %w", err)
			}
		}
		now := counting.counts()
		d := CallCounts{ClaimedTasks: now.ClaimedTasks - last.ClaimedTasks, ClaimTime: now.ClaimTime - last.ClaimTime}
		sm.ClaimPerTask, last = d.ClaimPerTask(), now
		sm.Done = counting.succeeded.Load()
		out = append(out, sm)
		return nil
	}

	buckets := bucketCount(ctx, s)
	perTick := max(cfg.Rate/10, 1)
	batch := make([]store.NewTask, perTick)
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextSample := cfg.Sample
	inserted := 0
	for i := 0; time.Since(start) < cfg.Duration; i++ {
		select {
		case <-ctx.Done():
			return out, context.Cause(ctx)
		case <-tick.C:
		}
		for j := range batch {
			key := fmt.Sprintf("k%d-%d", i, j)
			batch[j] = store.NewTask{Kind: "noop", Key: key, Bucket: (i*perTick + j) % buckets}
		}
		if _, err := s.CreateTasks(ctx, batch); err != nil {
			return out, fmt.Errorf("insert: %w", err)
		}
		inserted += len(batch)
		if at := time.Since(start); at >= nextSample {
			if err := sample(at); err != nil {
				return out, err
			}
			nextSample += cfg.Sample
		}
	}
	if _, err := counting.waitSucceeded(ctx, inserted, nil); err != nil {
		return out, err
	}
	return out, sample(time.Since(start))
}

// bucketCount is the fleet's bucket count, read once per run.
func bucketCount(ctx context.Context, s Store) int {
	if m, err := s.Meta(ctx); err == nil && m.NumBuckets > 0 {
		return m.NumBuckets
	}
	return 1
}

// SizeRun is the samples of one sustained run, under the name its curves
// carry on the table-size charts.
type SizeRun struct {
	Name    string
	Samples []SizeSample
}

// The curve files WriteSizeCurves writes, in the format of
// docs/charts/data/README.md ("flotilla-series/1"), which the bench
// module's charts package draws as SVG.
const (
	SizeCurveFile = "table-size.json"
	RowsCurveFile = "table-size-rows.json"
)

// sizeCurves is a curve file: the benchmark module does not import the
// bench module (which depends on this one), so the shape is written here
// and checked by the charts package on reading.
type sizeCurves struct {
	Format string      `json:"format"`
	Chart  string      `json:"chart"`
	Title  string      `json:"title"`
	X      curveAxis   `json:"x"`
	Y      curveAxis   `json:"y"`
	Source string      `json:"source"`
	Lines  []sizeCurve `json:"series"`
}

type curveAxis struct {
	Label string `json:"label"`
}

type sizeCurve struct {
	Name   string       `json:"name"`
	Points []curvePoint `json:"points"`
}

type curvePoint struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// WriteSizeCurves writes the runs' samples into dir as two curve files: the
// bytes on disk of the task table, its indexes and the event table together
// (SizeCurveFile), and the task table's rows (RowsCurveFile), each against
// the seconds since the start of the load. load says what load they ran
// under, for the titles ("a steady 500 tasks/s"); source, what measured them.
// A run named like a curve already in a file replaces it; the file's other
// curves stay, so a run of one variant updates its curve and leaves the rest.
func WriteSizeCurves(dir, load, source string, runs []SizeRun) error {
	if len(runs) == 0 {
		return errors.New("size curves: no runs")
	}
	for _, f := range []struct {
		file, chart, title, y string
		value                 func(SizeSample) float64
	}{
		{SizeCurveFile, "table-size", "Task and event tables on disk under " + load,
			"MB: task table, its indexes and the event table",
			func(s SizeSample) float64 {
				return math.Round(float64(s.TaskBytes+s.TaskIndexBytes+s.EventBytes)/(1<<20)*10) / 10
			}},
		{RowsCurveFile, "table-size-rows", "Rows in the task table under " + load,
			"rows of flotilla_tasks",
			func(s SizeSample) float64 { return float64(s.Tasks) }},
	} {
		path := filepath.Join(dir, f.file)
		c := sizeCurves{Format: "flotilla-series/1", Chart: f.chart, Title: f.title,
			X: curveAxis{Label: "seconds since the load started"}, Y: curveAxis{Label: f.y}}
		if b, err := os.ReadFile(path); err == nil {
			if err := json.Unmarshal(b, &c); err != nil {
				return fmt.Errorf("size curves: %s: %w", path, err)
			}
			if c.Format != "flotilla-series/1" || c.Chart != f.chart {
				return fmt.Errorf("size curves: %s holds format %q chart %q, not this benchmark's curves", path, c.Format, c.Chart)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("size curves: %w", err)
		}
		c.Source = source
		for _, r := range runs {
			line := sizeCurve{Name: r.Name}
			for _, s := range r.Samples {
				line.Points = append(line.Points, curvePoint{X: math.Round(s.At.Seconds()), Y: f.value(s)})
			}
			if i := slices.IndexFunc(c.Lines, func(l sizeCurve) bool { return l.Name == r.Name }); i >= 0 {
				c.Lines[i] = line
			} else {
				c.Lines = append(c.Lines, line)
			}
		}
		b, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("size curves: %w", err)
		}
	}
	return nil
}
