package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	_ "modernc.org/sqlite" // River's SQLite driver takes a database/sql pool; the same driver as flotilla's

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// runSQLite runs the bulk insert and the burn-down on SQLite: each system
// on a file of its own in a temporary directory, the same driver
// (modernc.org/sqlite) and the same file system, alternating the systems
// within each run. Flotilla has the audit trail and fencing on, as always.
func runSQLite(ctx context.Context, o options, out, log io.Writer, res *results) error {
	header(out, "")
	fmt.Fprintf(log, "compare: %d runs on SQLite\n", o.runs)
	dir, err := os.MkdirTemp("", "flotilla-compare-sqlite-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file := 0
	next := func(system string) string {
		file++
		return filepath.Join(dir, fmt.Sprintf("%s-%d.db", system, file))
	}
	for r := 1; r <= o.runs; r++ {
		if o.want("insert") {
			fmt.Fprintf(log, "compare: run %d: insert\n", r)
			if err := sqliteInsert(ctx, o, res, next); err != nil {
				return fmt.Errorf("run %d, insert: %w", r, err)
			}
			res.flush(out)
		}
		if o.want("burndown") {
			fmt.Fprintf(log, "compare: run %d: burndown\n", r)
			if err := sqliteBurnDown(ctx, o, res, next); err != nil {
				return fmt.Errorf("run %d, burndown: %w", r, err)
			}
			res.flush(out)
		}
	}
	return nil
}

func flotillaSQLite(ctx context.Context, path string) (*sqlite.Store, error) {
	s, err := sqlite.New(ctx, path)
	if err != nil {
		return nil, err
	}
	if _, err := s.Migrate(ctx, 0); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// riverSQLitePool opens River's pool as its driver's documentation asks:
// one connection, since River's concurrent operations otherwise meet
// SQLITE_BUSY; WAL and a busy timeout as flotilla's store sets them.
func riverSQLitePool(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

func riverSQLiteClient(db *sql.DB, st riverSettings, workers *river.Workers) (*river.Client[*sql.Tx], error) {
	cfg := &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: st.workers}},
		Workers:           workers,
		FetchCooldown:     st.fetchCooldown,
		FetchPollInterval: st.fetchPoll,
	}
	if workers == nil {
		cfg.Queues = nil
	}
	return river.NewClient(riversqlite.New(db), cfg)
}

func riverSQLiteDatabase(ctx context.Context, path string) (*sql.DB, error) {
	db, err := riverSQLitePool(path)
	if err != nil {
		return nil, err
	}
	m, err := rivermigrate.New(riversqlite.New(db), nil)
	if err == nil {
		_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	return db, nil
}

// riverSQLiteInsert inserts jobs no-op jobs with InsertMany, batch at a
// time (River's SQLite driver has no InsertManyFast of its own).
func riverSQLiteInsert(ctx context.Context, db *sql.DB, jobs, batch int) (time.Duration, error) {
	client, err := riverSQLiteClient(db, riverBest, nil)
	if err != nil {
		return 0, err
	}
	params := make([]river.InsertManyParams, batch)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}}
	}
	start := time.Now()
	for done := 0; done < jobs; {
		k := min(batch, jobs-done)
		if _, err := client.InsertMany(ctx, params[:k]); err != nil {
			return 0, fmt.Errorf("river insert: %w", err)
		}
		done += k
	}
	return time.Since(start), nil
}

func sqliteInsert(ctx context.Context, o options, res *results, next func(string) string) error {
	s, err := flotillaSQLite(ctx, next("flotilla"))
	if err != nil {
		return err
	}
	ir, err := benchmark.Insert(ctx, s, o.insertJobs, o.insertBatch, nil)
	s.Close()
	if err != nil {
		return err
	}
	res.add("SQLiteBulkInsert", "flotilla", "", o.insertJobs, ir.Elapsed, "jobs/s", ir.JobsPerSecond())

	db, err := riverSQLiteDatabase(ctx, next("river"))
	if err != nil {
		return err
	}
	d, err := riverSQLiteInsert(ctx, db, o.insertJobs, o.insertBatch)
	_ = db.Close()
	if err != nil {
		return err
	}
	res.add("SQLiteBulkInsert", "river", "", o.insertJobs, d, "jobs/s", benchmark.PerSecond(o.insertJobs, d))
	return nil
}

func sqliteBurnDown(ctx context.Context, o options, res *results, next func(string) string) error {
	jobs := o.burnJobs
	s, err := flotillaSQLite(ctx, next("flotilla"))
	if err != nil {
		return err
	}
	if _, err := benchmark.Insert(ctx, s, jobs, 10_000, nil); err != nil {
		s.Close()
		return err
	}
	bd, err := benchmark.BurnDown(ctx, s, jobs, node.Config{NodeID: "bench", Concurrency: o.concurrency}, nil)
	s.Close()
	if err != nil {
		return err
	}
	res.add("SQLiteBurnDown", "flotilla", "best", jobs, bd.Elapsed, "jobs/s", bd.JobsPerSecond(),
		metric{"client-cpu-us/job", perJobMicros(bd.ClientCPU, jobs)})

	db, err := riverSQLiteDatabase(ctx, next("river"))
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := riverSQLiteInsert(ctx, db, jobs, 10_000); err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := riverSQLiteClient(db, riverBest, workers)
	if err != nil {
		return err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: jobs + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()
	clientBefore := benchmark.ProcessCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	var last time.Time
	stall := time.NewTimer(benchmark.StallTimeout)
	defer stall.Stop()
	for done := 0; done < jobs; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return fmt.Errorf("river burn-down: job %d: %s", ev.Job.ID, ev.Kind)
			}
			done++
			last = time.Now()
			if done%1000 == 0 {
				stall.Reset(benchmark.StallTimeout)
			}
		case <-stall.C:
			return fmt.Errorf("river burn-down on SQLite: stalled after %d of %d jobs", done, jobs)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	elapsed := last.Sub(start)
	res.add("SQLiteBurnDown", "river", "best", jobs, elapsed, "jobs/s", benchmark.PerSecond(jobs, elapsed),
		metric{"client-cpu-us/job", perJobMicros(benchmark.ProcessCPU()-clientBefore, jobs)})
	return nil
}
