package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/benchmark"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure the fleet: bulk-insert no-op tasks, burn them down on a node in this process, and time single inserts to their start",
		Description: "Run it on a fleet of its own: it refuses a fleet with live nodes or unfinished tasks, " +
			"and leaves its tasks behind, finished.",
		ArgsUsage: " ",
		// The nodes' start and stop lines would interleave with the
		// progress bar: bench logs warnings and errors only, by default.
		Flags: []cli.Flag{
			dsnFlag,
			dsnFileFlag,
			&cli.StringFlag{Name: logLevelFlag.Name, Value: "warn", Usage: logLevelFlag.Usage},
			logFormatFlag,
			&cli.IntFlag{Name: "jobs", Value: 100_000, Usage: "no-op tasks to insert and burn down"},
			&cli.IntFlag{Name: "concurrency", Value: benchmark.BestConcurrency, Usage: "the burn-down node's concurrency"},
			&cli.IntFlag{Name: "insert-batch", Value: benchmark.DefaultInsertBatch, Usage: "tasks per bulk insert (COPY from 100)"},
			&cli.IntFlag{Name: "latency-jobs", Usage: "single inserts timed to their start",
				DefaultText: fmt.Sprintf("min(jobs, %d)", benchmark.DefaultLatencyJobs)},
			&cli.IntFlag{Name: "rate", Value: benchmark.DefaultLatencyRate, Usage: "single inserts per second while timing the start latency"},
			jsonFlag,
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			cfg, err := benchConfig(c)
			if err != nil {
				return err
			}
			log, err := newLogger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			cfg.Logger = log
			_, target, err := requireDSN(c)
			if err != nil {
				return err
			}
			if _, err := target.Ensure(c.Context); err != nil {
				return err
			}
			s, err := target.Open(c.Context)
			if err != nil {
				return err
			}
			defer s.Close()
			if _, err := s.Migrate(c.Context, 0); err != nil {
				return err
			}
			bar := newProgressBar(c.App.ErrWriter)
			cfg.Progress = bar.update
			bs, ok := s.(benchmark.Store)
			if !ok {
				return fmt.Errorf("worker bench needs a store with notifications, not %T", s)
			}
			r, err := benchmark.Run(c.Context, bs, cfg)
			bar.finish()
			if err != nil {
				return err
			}
			return printBench(c.App.Writer, r, c.Bool(jsonFlag.Name))
		},
	}
}

// benchConfig maps the flags onto benchmark.Config, refusing values that
// cannot work with the value and what is valid.
func benchConfig(c *cli.Context) (benchmark.Config, error) {
	atLeast := func(name string, lo int) (int, error) {
		v := c.Int(name)
		if v < lo {
			return 0, invalid(fmt.Errorf("invalid --%s %d: it must be at least %d", name, v, lo))
		}
		return v, nil
	}
	var cfg benchmark.Config
	var err error
	if cfg.Jobs, err = atLeast("jobs", 1); err != nil {
		return cfg, err
	}
	if cfg.Concurrency, err = atLeast("concurrency", 1); err != nil {
		return cfg, err
	}
	if cfg.InsertBatch, err = atLeast("insert-batch", 1); err != nil {
		return cfg, err
	}
	if cfg.LatencyRate, err = atLeast("rate", 1); err != nil {
		return cfg, err
	}
	if c.IsSet("latency-jobs") {
		if cfg.LatencyJobs, err = atLeast("latency-jobs", 1); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

func printBench(w io.Writer, r benchmark.Report, asJSON bool) error {
	if asJSON {
		return printJSON(w, map[string]any{
			"jobs":                   r.Jobs,
			"concurrency":            r.Concurrency,
			"insert_batch":           r.Insert.Batch,
			"insert_seconds":         r.Insert.Elapsed.Seconds(),
			"insert_jobs_per_second": round(r.Insert.JobsPerSecond()),
			"burn_down_seconds":      r.BurnDown.Elapsed.Seconds(),
			"jobs_per_second":        round(r.BurnDown.JobsPerSecond()),
			"latency_jobs":           r.Latency.N,
			"latency_rate":           r.LatencyRate,
			"p50_ms":                 benchmark.Millis(r.Latency.P50),
			"p90_ms":                 benchmark.Millis(r.Latency.P90),
			"p99_ms":                 benchmark.Millis(r.Latency.P99),
			"max_ms":                 benchmark.Millis(r.Latency.Max),
		})
	}
	fmt.Fprintf(w, "insert     %d jobs in %.2fs: %.0f jobs/s (batches of %d)\n",
		r.Jobs, r.Insert.Elapsed.Seconds(), r.Insert.JobsPerSecond(), r.Insert.Batch)
	fmt.Fprintf(w, "burn-down  %d jobs in %.2fs: %.0f jobs/s (concurrency %d)\n",
		r.Jobs, r.BurnDown.Elapsed.Seconds(), r.BurnDown.JobsPerSecond(), r.Concurrency)
	fmt.Fprintf(w, "latency    %d single inserts at %d/s, insert to start: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms\n",
		r.Latency.N, r.LatencyRate, benchmark.Millis(r.Latency.P50), benchmark.Millis(r.Latency.P90), benchmark.Millis(r.Latency.P99))
	return nil
}

func round(f float64) float64 { return float64(int64(f + 0.5)) }

// progressBar draws one line per phase on a terminal, and nothing
// elsewhere (a pipe, a file, a test).
type progressBar struct {
	w     io.Writer
	on    bool
	phase benchmark.Phase
	last  time.Time
}

func newProgressBar(w io.Writer) *progressBar {
	f, ok := w.(*os.File)
	on := false
	if ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			on = true
		}
	}
	return &progressBar{w: w, on: on}
}

const barWidth = 40

func (b *progressBar) update(phase benchmark.Phase, done, total int) {
	if !b.on || total <= 0 {
		return
	}
	if phase != b.phase && b.phase != "" {
		fmt.Fprintln(b.w)
	}
	// At most every 50 ms, but always the first and the last.
	if phase == b.phase && done < total && time.Since(b.last) < 50*time.Millisecond {
		return
	}
	b.phase, b.last = phase, time.Now()
	filled := barWidth * done / total
	fmt.Fprintf(b.w, "\r%-14s [%s%s] %d/%d", phase, strings.Repeat("=", filled), strings.Repeat(" ", barWidth-filled), done, total)
}

func (b *progressBar) finish() {
	if b.on && b.phase != "" {
		fmt.Fprintln(b.w)
	}
}
