// Command sqlitelatency measures the start latency of flotilla on SQLite:
// on one idle process (submit, then wait for the handler to start, one task
// at a time), and across processes on one file (a `worker run` process
// runs the tasks that this process submits at -rate a second). Across
// processes the latency is the task's start minus its creation, both by
// SQLite's clock (millisecond resolution), so that no two clocks are
// compared.
//
//	go build -o /tmp/worker ../cmd/worker
//	go run ./cmd/sqlitelatency -worker /tmp/worker -runs 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

func main() {
	var (
		worker    = flag.String("worker", "", "the worker binary that runs the tasks submitted across processes (required)")
		runs      = flag.Int("runs", 3, "runs of each measurement")
		idleJobs  = flag.Int("idle-jobs", 500, "tasks of the idle one-process measurement, one at a time")
		crossJobs = flag.Int("cross-jobs", 4000, "tasks submitted across processes")
		rate      = flag.Int("rate", 200, "submits per second across processes")
	)
	flag.Parse()
	if *worker == "" || *runs < 1 || *idleJobs < 1 || *crossJobs < 1 || *rate < 1 {
		fmt.Fprintln(os.Stderr, "sqlitelatency: give -worker PATH, and positive -runs, -idle-jobs, -cross-jobs and -rate")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "flotilla-sqlitelatency-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	for r := 1; r <= *runs; r++ {
		p, err := idle(ctx, filepath.Join(dir, fmt.Sprintf("idle-%d.db", r)), *idleJobs)
		if err != nil {
			fail(err)
		}
		fmt.Printf("run %d  idle, one process      %s\n", r, show(p))
		p, err = cross(ctx, *worker, filepath.Join(dir, fmt.Sprintf("cross-%d.db", r)), *crossJobs, *rate)
		if err != nil {
			fail(err)
		}
		fmt.Printf("run %d  across processes, %d/s  %s\n", r, *rate, show(p))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sqlitelatency:", err)
	os.Exit(1)
}

func show(p benchmark.Percentiles) string {
	return fmt.Sprintf("n %d  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms", p.N,
		benchmark.Millis(p.P50), benchmark.Millis(p.P90), benchmark.Millis(p.P99), benchmark.Millis(p.Max))
}

func open(ctx context.Context, path string) (*sqlite.Store, error) {
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

// idle times submit-to-start on a node in this process, one task at a time.
func idle(ctx context.Context, path string, jobs int) (benchmark.Percentiles, error) {
	s, err := open(ctx, path)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	defer s.Close()
	return benchmark.StartLatency(ctx, s, node.Config{NodeID: "idle"}, benchmark.LatencyConfig{Jobs: jobs}, nil)
}

// cross runs `worker run` on the file, submits jobs noop tasks at rate a
// second from this process, and reads each task's start minus creation.
func cross(ctx context.Context, worker, path string, jobs, rate int) (benchmark.Percentiles, error) {
	s, err := open(ctx, path)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	defer s.Close()
	cmd := exec.CommandContext(ctx, worker, "run", "--dsn", "sqlite:"+path, "--node-id", "runner")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return benchmark.Percentiles{}, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	if err := waitHeld(ctx, s); err != nil {
		return benchmark.Percentiles{}, err
	}
	client, err := flotilla.NewClient(ctx, s)
	if err != nil {
		return benchmark.Percentiles{}, err
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	ids := make([]int64, 0, jobs)
	for i := range jobs {
		<-tick.C
		t, err := client.Submit(ctx, flotilla.TaskRequest{Kind: "noop", Key: fmt.Sprintf("k-%d", i)})
		if err != nil {
			return benchmark.Percentiles{}, err
		}
		ids = append(ids, t.ID)
	}
	samples := make([]time.Duration, 0, jobs)
	deadline := time.Now().Add(time.Minute)
	for _, id := range ids {
		for {
			t, err := s.GetTask(ctx, id)
			if err != nil {
				return benchmark.Percentiles{}, err
			}
			if t.Status == task.Succeeded {
				samples = append(samples, t.StartedAt.Sub(t.CreatedAt))
				break
			}
			if time.Now().After(deadline) {
				return benchmark.Percentiles{}, fmt.Errorf("task %d is %s after a minute", id, t.Status)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return benchmark.PercentilesOf(samples), nil
}

// waitHeld waits until the worker holds every bucket.
func waitHeld(ctx context.Context, s store.Store) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		leases, err := s.ListBuckets(ctx)
		if err == nil {
			held := 0
			for _, l := range leases {
				if l.Holder != "" {
					held++
				}
			}
			if held == bucket.DefaultCount {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("the worker did not take every bucket within 30s")
}
