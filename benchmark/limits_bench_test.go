package benchmark_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// tasksPerLimitKey is the backlog of each limit key in the limited
// burn-down: 100,000 tasks over 10,000 keys.
const tasksPerLimitKey = 10

// BenchmarkBurnDownLimitedKeys burns down b.N no-op tasks over b.N/10 limit
// keys on one node holding every bucket, twice over the same backlog: with
// no limit declared (limited=false, the plain claim), and with every key of
// the kind limited to 1 running at once (limited=true, the limited claim).
// The issue asks the limited run for at least 50% of the unlimited one's
// tasks/s; run the binary several times, alternating, and compare the two
// within each run.
//
//	go test -c -o bench-limits ./benchmark/
//	./bench-limits -test.run '^$' -test.bench 'BurnDownLimitedKeys' -test.benchtime 100000x -test.count 1
func BenchmarkBurnDownLimitedKeys(b *testing.B) {
	for _, limited := range []bool{false, true} {
		b.Run(fmt.Sprintf("limited=%v", limited), func(b *testing.B) {
			tb := setup(b, 0, postgres.WithMaxConns(20))
			keys := max(1, b.N/tasksPerLimitKey)
			if err := insertOverLimitKeys(tb.ctx, tb.store, b.N, keys); err != nil {
				b.Fatal(err)
			}
			if limited {
				if _, err := tb.store.UpsertLimit(tb.ctx, store.Limit{Name: "one-per-key", Kind: benchmark.Kind,
					Per: store.PerKey, Concurrency: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			r, err := benchmark.BurnDown(tb.ctx, tb.store, b.N, node.Config{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(r.JobsPerSecond(), "tasks/s")
			b.ReportMetric(float64(keys), "keys")
			b.ReportMetric(float64(r.ServerCPU.Nanoseconds())/1000/float64(b.N), "server-cpu-us/task")
			b.ReportMetric(float64(r.ClientCPU.Nanoseconds())/1000/float64(b.N), "client-cpu-us/task")
		})
	}
}

// insertOverLimitKeys creates jobs no-op tasks, each under its own key, the
// i-th under limit key i mod keys, in the bucket of its limit key, in
// batches of benchmark.DefaultInsertBatch.
func insertOverLimitKeys(ctx context.Context, s *postgres.Store, jobs, keys int) error {
	meta, err := s.Meta(ctx)
	if err != nil {
		return err
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		return err
	}
	batch := make([]store.NewTask, 0, benchmark.DefaultInsertBatch)
	for i := range jobs {
		lk := fmt.Sprintf("tenant-%d", i%keys)
		batch = append(batch, store.NewTask{Kind: benchmark.Kind, Key: fmt.Sprintf("task-%d", i), LimitKey: lk,
			Bucket: policy.Of(lk)})
		if len(batch) == cap(batch) || i == jobs-1 {
			if _, err := s.CreateTasks(ctx, batch); err != nil {
				return fmt.Errorf("insert: after %d of %d tasks: %w", i+1-len(batch), jobs, err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

// fleetLimitTask is how long each task of the fleet-wide limit benchmark
// runs: the 50 ms.
const fleetLimitTask = 50 * time.Millisecond

// BenchmarkFleetKindLimit runs b.N tasks of 50 ms, spread over every
// bucket, on 4 nodes in this process that split the buckets between them,
// with the kind limited to N running in the whole fleet. The limit's
// theoretical rate is N / 50 ms; of-theoretical is the measured rate over
// it, from the nodes' start to the last handler's end (the issue asks for
// at least 90%). steady-of-theoretical leaves out the first and last tenth
// of the tasks: the rate once the holders have taken their shares.
// peak-running is the most handlers that ran at once across the nodes,
// which must not exceed N.
//
// by=node-concurrency is the same load with no limit declared and each
// node's concurrency set to N/4: the fixed split a fleet-wide limit
// replaces, whose turnaround (outcome write, then claim) is the same, so
// that the two rates side by side show what the shares themselves cost.
//
//	./bench-limits -test.run '^$' -test.bench 'FleetKindLimit' -test.benchtime 4000x -test.count 1
func BenchmarkFleetKindLimit(b *testing.B) {
	const nodes = 4
	for _, limit := range []int{8, 20} {
		for _, split := range []bool{false, true} {
			name := fmt.Sprintf("nodes=%d/limit=%d/by=fleet-limit", nodes, limit)
			if split {
				name = fmt.Sprintf("nodes=%d/limit=%d/by=node-concurrency", nodes, limit)
			}
			b.Run(name, func(b *testing.B) {
				tb := setup(b, 0, postgres.WithMaxConns(20))
				if _, err := benchmark.Insert(tb.ctx, tb.store, b.N, 0, nil); err != nil {
					b.Fatal(err)
				}
				if err := benchmark.Analyze(tb.ctx, tb.store); err != nil {
					b.Fatal(err)
				}
				concurrency := 0 // the default: the fleet limit is what bounds the nodes
				if split {
					concurrency = limit / nodes
				} else if _, err := tb.store.UpsertLimit(tb.ctx, store.Limit{Name: "fleet", Kind: benchmark.Kind,
					Per: store.PerFleet, Concurrency: limit}); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				r, err := runFleetLimited(tb.ctx, tb.store, b.N, nodes, concurrency)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if r.peak > limit {
					b.Errorf("%d handlers ran at once across the fleet, more than the limit of %d", r.peak, limit)
				}
				theoretical := float64(limit) / fleetLimitTask.Seconds()
				b.ReportMetric(benchmark.PerSecond(b.N, r.elapsed), "tasks/s")
				b.ReportMetric(benchmark.PerSecond(b.N, r.elapsed)/theoretical, "of-theoretical")
				b.ReportMetric(r.steadyRate/theoretical, "steady-of-theoretical")
				b.ReportMetric(float64(r.peak), "peak-running")
			})
		}
	}
}

// fleetLimitedRun is the outcome of runFleetLimited.
type fleetLimitedRun struct {
	elapsed    time.Duration // from the nodes' start to the last handler's end
	steadyRate float64       // tasks/s between the ends of the first and the last tenth
	peak       int           // most handlers running at once
}

// runFleetLimited runs the backlog of jobs tasks with a 50 ms handler on
// nodes nodes in this process, each declaring an equal share of the
// buckets in contiguous ranges, and returns once every handler has ended.
// concurrency is each node's (0: the default).
func runFleetLimited(ctx context.Context, s *postgres.Store, jobs, nodes, concurrency int) (fleetLimitedRun, error) {
	meta, err := s.Meta(ctx)
	if err != nil {
		return fleetLimitedRun{}, err
	}
	var (
		mu      sync.Mutex
		ends    = make([]time.Time, 0, jobs)
		running atomic.Int64
		peak    atomic.Int64
		done    = make(chan struct{})
	)
	handler := func(ctx context.Context, _ *task.Task) error {
		now := running.Add(1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		t := time.NewTimer(fleetLimitTask)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			running.Add(-1)
			return context.Cause(ctx)
		}
		running.Add(-1)
		mu.Lock()
		ends = append(ends, time.Now())
		if len(ends) == jobs {
			close(done)
		}
		mu.Unlock()
		return nil
	}
	var started []*node.Node
	defer func() {
		for _, n := range started {
			_ = n.Shutdown(context.WithoutCancel(ctx))
		}
	}()
	begin := time.Now()
	for i := range nodes {
		lo, hi := i*meta.NumBuckets/nodes, (i+1)*meta.NumBuckets/nodes-1
		set, err := bucket.ParseSet(fmt.Sprintf("%d-%d", lo, hi), meta.NumBuckets)
		if err != nil {
			return fleetLimitedRun{}, err
		}
		n, err := node.New(s, node.Config{NodeID: fmt.Sprintf("fleet-%d", i), Buckets: set, Concurrency: concurrency,
			Logger: zap.NewNop()})
		if err != nil {
			return fleetLimitedRun{}, err
		}
		n.Register(benchmark.Kind, handler)
		if err := n.Start(ctx); err != nil {
			return fleetLimitedRun{}, fmt.Errorf("start node %s: %w", n.ID(), err)
		}
		started = append(started, n)
	}
	select {
	case <-done:
	case <-time.After(benchmark.StallTimeout + time.Duration(jobs)*fleetLimitTask):
		mu.Lock()
		n := len(ends)
		mu.Unlock()
		return fleetLimitedRun{}, fmt.Errorf("fleet-wide limit: %d of %d tasks ran", n, jobs)
	case <-ctx.Done():
		return fleetLimitedRun{}, context.Cause(ctx)
	}
	mu.Lock()
	r := fleetLimitedRun{elapsed: ends[len(ends)-1].Sub(begin), peak: int(peak.Load())}
	lo, hi := jobs/10, jobs-1-jobs/10
	if hi > lo {
		r.steadyRate = benchmark.PerSecond(hi-lo, ends[hi].Sub(ends[lo]))
	}
	mu.Unlock()
	var errs []error
	for _, n := range started {
		errs = append(errs, n.Shutdown(context.WithoutCancel(ctx)))
	}
	started = nil
	return r, errors.Join(errs...)
}
