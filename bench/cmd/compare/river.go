package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/flotilla-dev/flotilla/benchmark"
)

// River's settings. Its defaults are a client as its documentation starts
// one: 100 workers on the default queue, the default fetch cooldown
// (100 ms) and poll interval (1 s), pgxpool's default pool. Its best, for
// throughput and latency alike, are those of River's own benchmark (1,000
// workers, a 2 ms cooldown and a 20 ms poll), a pool of 20 connections as
// flotilla's, and custom plans forced on every connection: a generic plan
// cached while the job table was empty otherwise sends its fetch to
// seconds once the table fills.
type riverSettings struct {
	name          string
	workers       int
	fetchCooldown time.Duration
	fetchPoll     time.Duration
	maxConns      int32
	customPlans   bool
}

var (
	riverDefault = riverSettings{name: "default", workers: 100}
	riverBest    = riverSettings{
		name: "best", workers: 1000, fetchCooldown: 2 * time.Millisecond, fetchPoll: 20 * time.Millisecond,
		maxConns: 20, customPlans: true,
	}
)

func riverPool(ctx context.Context, dsn string, st riverSettings) (*pgxpool.Pool, error) {
	return riverPoolTraced(ctx, dsn, st, nil)
}

// riverPoolTraced is riverPool whose statements are counted by tracer.
func riverPoolTraced(ctx context.Context, dsn string, st riverSettings, tracer *statementCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	if st.maxConns > 0 {
		cfg.MaxConns = st.maxConns
	}
	if st.customPlans {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func riverMigrate(ctx context.Context, dsn string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct{ river.WorkerDefaults[noopArgs] }

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

type latencyArgs struct {
	SubmittedNS int64 `json:"submitted_ns"`
}

func (latencyArgs) Kind() string { return "bench_latency" }

type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
	started chan time.Duration
}

func (w *latencyWorker) Work(_ context.Context, j *river.Job[latencyArgs]) error {
	d := time.Since(time.Unix(0, j.Args.SubmittedNS))
	select {
	case w.started <- d:
	default:
	}
	return nil
}

type blockArgs struct{}

func (blockArgs) Kind() string { return "bench_block" }

type blockWorker struct {
	river.WorkerDefaults[blockArgs]
	running   chan int64
	cancelled chan time.Time
}

func (w *blockWorker) Work(ctx context.Context, j *river.Job[blockArgs]) error {
	w.running <- j.ID
	<-ctx.Done()
	w.cancelled <- time.Now()
	return ctx.Err()
}

func newRiverClient(pool *pgxpool.Pool, st riverSettings, workers *river.Workers) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: st.workers}},
		Workers:           workers,
		FetchCooldown:     st.fetchCooldown,
		FetchPollInterval: st.fetchPoll,
	}
	if workers == nil {
		cfg.Queues = nil // an insert-only client
	}
	return river.NewClient(riverpgxv5.New(pool), cfg)
}

// riverInsert inserts jobs no-op jobs in batches of batch with InsertMany,
// or InsertManyFast (COPY) when fast.
func riverInsert(ctx context.Context, dsn string, jobs, batch int, fast bool) (time.Duration, error) {
	pool, err := riverPool(ctx, dsn, riverBest)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	client, err := newRiverClient(pool, riverBest, nil)
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
		if fast {
			_, err = client.InsertManyFast(ctx, params[:k])
		} else {
			_, err = client.InsertMany(ctx, params[:k])
		}
		if err != nil {
			return 0, fmt.Errorf("river insert: %w", err)
		}
		done += k
	}
	return time.Since(start), nil
}

// riverRun is what a River burn-down measured.
type riverRun struct {
	elapsed              time.Duration
	statements           int64
	serverCPU, clientCPU time.Duration
}

// riverBurnDown works the backlog already in the database, jobs no-op jobs,
// timed from the client's start to the last completion event. The table is
// analyzed before the clock starts.
func riverBurnDown(ctx context.Context, dsn string, jobs int, st riverSettings) (riverRun, error) {
	tracer := &statementCounter{}
	pool, err := riverPoolTraced(ctx, dsn, st, tracer)
	if err != nil {
		return riverRun{}, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `ANALYZE river_job`); err != nil {
		return riverRun{}, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := newRiverClient(pool, st, workers)
	if err != nil {
		return riverRun{}, err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: jobs + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()
	serverBefore, cpuErr := benchmark.ReadBackendCPU(ctx, pool)
	statementsBefore := tracer.n.Load()
	clientBefore := benchmark.ProcessCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return riverRun{}, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	var last time.Time
	stall := time.NewTimer(benchmark.StallTimeout)
	defer stall.Stop()
	for done := 0; done < jobs; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return riverRun{}, fmt.Errorf("river burn-down: job %d: %s", ev.Job.ID, ev.Kind)
			}
			done++
			last = time.Now()
			if done%1000 == 0 {
				stall.Reset(benchmark.StallTimeout)
			}
		case <-stall.C:
			return riverRun{}, fmt.Errorf("river burn-down: stalled after %d of %d jobs", done, jobs)
		case <-ctx.Done():
			return riverRun{}, context.Cause(ctx)
		}
	}
	r := riverRun{
		elapsed: last.Sub(start), statements: tracer.n.Load() - statementsBefore,
		clientCPU: benchmark.ProcessCPU() - clientBefore,
	}
	if cpuErr == nil {
		if after, err := benchmark.ReadBackendCPU(ctx, pool); err == nil {
			r.serverCPU = after.Since(serverBefore)
			r.statements-- // the read itself
		}
	}
	return r, nil
}

// riverStartLatency mirrors benchmark.StartLatency, driven by the same
// benchmark.MeasureStarts: timed from the call to Insert to the start of
// Work.
func riverStartLatency(ctx context.Context, dsn string, st riverSettings, lc benchmark.LatencyConfig) (benchmark.Percentiles, error) {
	pool, err := riverPool(ctx, dsn, st)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	defer pool.Close()
	w := &latencyWorker{started: make(chan time.Duration, lc.Jobs)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := newRiverClient(pool, st, workers)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	if err := client.Start(ctx); err != nil {
		return benchmark.Percentiles{}, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	insert := func() error {
		_, err := client.Insert(ctx, latencyArgs{SubmittedNS: time.Now().UnixNano()}, nil)
		return err
	}
	p, err := benchmark.MeasureStarts(ctx, lc, insert, w.started, nil)
	if err != nil {
		return benchmark.Percentiles{}, fmt.Errorf("river start latency: %w", err)
	}
	return p, nil
}

// riverCancel mirrors benchmark.StopToCancel with JobCancel.
func riverCancel(ctx context.Context, dsn string, st riverSettings, jobs int) (benchmark.Percentiles, error) {
	pool, err := riverPool(ctx, dsn, st)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	defer pool.Close()
	w := &blockWorker{running: make(chan int64, 1), cancelled: make(chan time.Time, 1)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := newRiverClient(pool, st, workers)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	if err := client.Start(ctx); err != nil {
		return benchmark.Percentiles{}, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	samples := make([]time.Duration, 0, jobs)
	for range jobs {
		res, err := client.Insert(ctx, blockArgs{}, nil)
		if err != nil {
			return benchmark.Percentiles{}, err
		}
		select {
		case <-w.running:
		case <-time.After(benchmark.StallTimeout):
			return benchmark.Percentiles{}, fmt.Errorf("river cancel: job %d did not start", res.Job.ID)
		}
		t0 := time.Now()
		if _, err := client.JobCancel(ctx, res.Job.ID); err != nil {
			return benchmark.Percentiles{}, err
		}
		select {
		case at := <-w.cancelled:
			samples = append(samples, at.Sub(t0))
		case <-time.After(benchmark.StallTimeout):
			return benchmark.Percentiles{}, fmt.Errorf("river cancel: job %d: work context not cancelled", res.Job.ID)
		}
	}
	return benchmark.PercentilesOf(samples), nil
}
