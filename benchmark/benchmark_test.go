package benchmark_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

type testBundle struct {
	ctx   context.Context
	dsn   string
	store *postgres.Store
}

// setup gives a test a migrated fleet of numBuckets buckets (0: the
// default) on a database of its own.
func setup(t testing.TB, numBuckets int, opts ...postgres.Option) *testBundle {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped by -short")
	}
	ctx := context.Background()
	dsn := testdb.New(t)
	s, err := postgres.New(ctx, dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, numBuckets); err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: ctx, dsn: dsn, store: s}
}

func (tb *testBundle) count(t testing.TB, status task.Status) int {
	t.Helper()
	var n int
	if err := tb.store.Pool().QueryRow(tb.ctx, `SELECT count(*) FROM flotilla_tasks WHERE status = $1`, string(status)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInsertAndBurnDown(t *testing.T) {
	tb := setup(t, 0)
	const jobs = 2500
	var last int
	ins, err := benchmark.Insert(tb.ctx, tb.store, jobs, 1000, func(done int) { last = done })
	if err != nil {
		t.Fatal(err)
	}
	if ins.Jobs != jobs || last != jobs || ins.Elapsed <= 0 {
		t.Errorf("insert result %+v, last progress %d; want %d jobs", ins, last, jobs)
	}
	if got := tb.count(t, task.Queued); got != jobs {
		t.Fatalf("%d queued tasks after the insert, want %d", got, jobs)
	}
	// The tasks are spread over every bucket.
	var buckets int
	if err := tb.store.Pool().QueryRow(tb.ctx, `SELECT count(DISTINCT bucket) FROM flotilla_tasks`).Scan(&buckets); err != nil {
		t.Fatal(err)
	}
	if buckets != 64 {
		t.Errorf("tasks in %d buckets, want all 64", buckets)
	}

	before, err := benchmark.ReadDBStats(tb.ctx, tb.dsn)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := benchmark.BurnDown(tb.ctx, tb.store, jobs, node.Config{Concurrency: 200}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bd.Jobs != jobs || bd.Nodes != 1 || bd.Elapsed <= 0 {
		t.Errorf("burn-down result %+v", bd)
	}
	if bd.Calls.ClaimedTasks != jobs || bd.Calls.AdvancedTasks != jobs || bd.Calls.Claims == 0 || bd.Calls.Advances == 0 {
		t.Errorf("call counts %+v, want %d tasks claimed and advanced", bd.Calls, jobs)
	}
	if got := tb.count(t, task.Succeeded); got != jobs {
		t.Errorf("%d succeeded tasks after the burn-down, want %d", got, jobs)
	}
	// Every claim and every completion wrote its audit event. The
	// counters are published by backends at most once a second, or when
	// they exit: wait for them rather than assert at once.
	tb.store.Pool().Reset()
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for {
		after, err := benchmark.ReadDBStats(tb.ctx, tb.dsn)
		if err != nil {
			t.Fatal(err)
		}
		d := after.Sub(before)
		if d.Tables["flotilla_task_events"].Inserted >= 2*jobs && d.Commits > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statistics after the burn-down: %+v; want at least %d events inserted", d, 2*jobs)
		}
		time.Sleep(100 * time.Millisecond) // waiting for PostgreSQL to publish its counters
	}
}

func TestBurnDownSpread(t *testing.T) {
	tb := setup(t, 256)
	const jobs = 1000
	if _, err := benchmark.Insert(tb.ctx, tb.store, jobs, 0, nil); err != nil {
		t.Fatal(err)
	}
	bd, err := benchmark.BurnDownSpread(tb.ctx, tb.store, jobs, 4, node.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bd.Nodes != 4 || bd.Calls.ClaimedTasks != jobs {
		t.Errorf("burn-down over 4 nodes: %+v", bd)
	}
	var nodes int
	if err := tb.store.Pool().QueryRow(tb.ctx, `SELECT count(DISTINCT node) FROM flotilla_tasks`).Scan(&nodes); err != nil {
		t.Fatal(err)
	}
	if nodes != 4 {
		t.Errorf("tasks run by %d nodes, want 4", nodes)
	}
	if _, err := benchmark.BurnDownSpread(tb.ctx, tb.store, jobs, 257, node.Config{}, nil); err == nil {
		t.Error("257 nodes for 256 buckets: no error")
	}
}

func TestStartLatency(t *testing.T) {
	tb := setup(t, 0)
	for _, lc := range []benchmark.LatencyConfig{
		{Jobs: 20},              // idle: one at a time
		{Jobs: 200, Rate: 1000}, // paced
	} {
		var last int
		p, err := benchmark.StartLatency(tb.ctx, tb.store, node.Config{}, lc, func(done int) { last = done })
		if err != nil {
			t.Fatalf("%+v: %v", lc, err)
		}
		if p.N != lc.Jobs || last != lc.Jobs {
			t.Errorf("%+v: %d samples, last progress %d", lc, p.N, last)
		}
		if !(0 < p.P50 && p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.Max) {
			t.Errorf("%+v: percentiles out of order: %+v", lc, p)
		}
	}
	if _, err := benchmark.StartLatency(tb.ctx, tb.store, node.Config{}, benchmark.LatencyConfig{}, nil); err == nil {
		t.Error("no jobs: no error")
	}
}

func TestStopToCancel(t *testing.T) {
	tb := setup(t, 0)
	p, err := benchmark.StopToCancel(tb.ctx, tb.store, node.Config{}, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.N != 3 || p.P50 <= 0 {
		t.Errorf("percentiles %+v", p)
	}
	if got := tb.count(t, task.Stopped); got != 3 {
		t.Errorf("%d stopped tasks, want 3", got)
	}
}

func TestRun(t *testing.T) {
	tb := setup(t, 0)
	var phases []benchmark.Phase
	r, err := benchmark.Run(tb.ctx, tb.store, benchmark.Config{
		Jobs: 300, LatencyJobs: 50,
		Progress: func(p benchmark.Phase, done, total int) {
			if len(phases) == 0 || phases[len(phases)-1] != p {
				phases = append(phases, p)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Jobs != 300 || r.Concurrency != benchmark.BestConcurrency || r.Latency.N != 50 ||
		r.Insert.JobsPerSecond() <= 0 || r.BurnDown.JobsPerSecond() <= 0 {
		t.Errorf("report %+v", r)
	}
	want := []benchmark.Phase{benchmark.PhaseInsert, benchmark.PhaseBurnDown, benchmark.PhaseLatency}
	if len(phases) != len(want) {
		t.Errorf("phases %v, want %v", phases, want)
	}

	// A fleet with unfinished tasks is refused.
	if _, err := tb.store.CreateTasks(tb.ctx, []store.NewTask{{Kind: "noop"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := benchmark.Run(tb.ctx, tb.store, benchmark.Config{Jobs: 10}); !errors.Is(err, benchmark.ErrFleetBusy) {
		t.Errorf("run on a fleet with a queued task: %v, want ErrFleetBusy", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg      benchmark.Config
		mentions string
	}{
		{benchmark.Config{}, "jobs is 0"},
		{benchmark.Config{Jobs: -5}, "jobs is -5"},
		{benchmark.Config{Jobs: 1, Concurrency: -1}, "concurrency is -1"},
		{benchmark.Config{Jobs: 1, LatencyRate: -2}, "rate is -2"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !contains(err.Error(), tc.mentions) {
			t.Errorf("Validate(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.mentions)
		}
	}
	if err := (benchmark.Config{Jobs: 1}).Validate(); err != nil {
		t.Errorf("Validate of a good config: %v", err)
	}
}

func TestPercentilesOf(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	p := benchmark.PercentilesOf(samples)
	if p.N != 100 || p.P50 != 50*time.Millisecond || p.P90 != 90*time.Millisecond ||
		p.P99 != 99*time.Millisecond || p.Max != 100*time.Millisecond {
		t.Errorf("PercentilesOf(1..100 ms) = %+v", p)
	}
	if (benchmark.PercentilesOf(nil) != benchmark.Percentiles{}) {
		t.Error("PercentilesOf(nil) is not zero")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
