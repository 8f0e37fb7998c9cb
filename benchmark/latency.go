package benchmark

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Kinds of the latency workloads' tasks.
const (
	// LatencyKind's handler notes when it started and returns.
	LatencyKind = "bench-latency"
	// BlockKind's handler runs until its context is cancelled.
	BlockKind = "bench-block"
)

// DefaultSubmitters is how many goroutines submit at once in a paced run,
// as an application's request handlers would.
const DefaultSubmitters = 16

// LatencyConfig shapes a start-latency run.
type LatencyConfig struct {
	// Jobs is the number of tasks submitted, each with its own Submit.
	Jobs int
	// Rate is the submissions per second, from Submitters goroutines. Zero
	// submits one task at a time and waits for its handler to start before
	// the next: the pickup time of an idle node.
	Rate       int
	Submitters int // DefaultSubmitters when zero
}

// latencyPayload carries the time its task was submitted.
type latencyPayload struct {
	SubmittedNS int64 `json:"submitted_ns"`
}

// StartLatency measures, on one node in this process holding every bucket
// (configured by cfg), the time from the call to Submit (insert and commit
// included) to the start of the task's handler. progress, when not nil, is
// called with the number of tasks started so far.
func StartLatency(ctx context.Context, s Store, cfg node.Config, lc LatencyConfig, progress func(done int)) (Percentiles, error) {
	if lc.Jobs <= 0 {
		return Percentiles{}, fmt.Errorf("start latency: %d jobs; give at least 1", lc.Jobs)
	}
	if lc.Rate < 0 {
		return Percentiles{}, fmt.Errorf("start latency: rate %d per second is negative", lc.Rate)
	}
	started := make(chan time.Duration, lc.Jobs)
	n, err := startNode(ctx, s, cfg, LatencyKind, func(_ context.Context, t *task.Task) error {
		now := time.Now()
		var p latencyPayload
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return err
		}
		select {
		case started <- now.Sub(time.Unix(0, p.SubmittedNS)):
		default: // a task from an earlier run: not ours to count
		}
		return nil
	})
	if err != nil {
		return Percentiles{}, err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	submit := func() error {
		payload, _ := json.Marshal(latencyPayload{SubmittedNS: time.Now().UnixNano()})
		_, err := n.Submit(ctx, node.SubmitRequest{Kind: LatencyKind, Payload: payload})
		return err
	}
	p, err := MeasureStarts(ctx, lc, submit, started, progress)
	if err != nil {
		return Percentiles{}, fmt.Errorf("start latency: %w", err)
	}
	return p, nil
}

// MeasureStarts drives a start-latency run for any system: lc.Jobs calls of
// submit, paced at lc.Rate a second from lc.Submitters goroutines, or one at
// a time with a wait for each start when the rate is zero. started delivers
// each task's time from submission to the start of its handler, as the
// handler measured it. StartLatency and the comparison with River both use
// it, so that the two systems are driven alike.
func MeasureStarts(ctx context.Context, lc LatencyConfig, submit func() error, started <-chan time.Duration, progress func(done int)) (Percentiles, error) {
	if lc.Jobs <= 0 {
		return Percentiles{}, fmt.Errorf("%d jobs; give at least 1", lc.Jobs)
	}
	if lc.Rate < 0 {
		return Percentiles{}, fmt.Errorf("rate %d per second is negative", lc.Rate)
	}
	if lc.Submitters <= 0 {
		lc.Submitters = DefaultSubmitters
	}
	samples := make([]time.Duration, 0, lc.Jobs)
	errs := make(chan error, lc.Submitters)
	collect := func() error {
		select {
		case err := <-errs:
			return fmt.Errorf("submit: %w", err)
		case d := <-started:
			samples = append(samples, d)
			if progress != nil {
				progress(len(samples))
			}
			return nil
		case <-time.After(StallTimeout):
			return fmt.Errorf("no task started for %v (%d of %d)", StallTimeout, len(samples), lc.Jobs)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}

	if lc.Rate == 0 {
		for range lc.Jobs {
			if err := submit(); err != nil {
				return Percentiles{}, fmt.Errorf("submit: %w", err)
			}
			if err := collect(); err != nil {
				return Percentiles{}, err
			}
		}
		return PercentilesOf(samples), nil
	}

	work := make(chan struct{}, lc.Jobs)
	var wg sync.WaitGroup
	for range lc.Submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if err := submit(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	pace := func() {
		defer close(work)
		interval := time.Second / time.Duration(lc.Rate)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for range lc.Jobs {
			select {
			case <-tick.C:
				work <- struct{}{}
			case <-ctx.Done():
				return
			}
		}
	}
	paced := make(chan struct{})
	go func() { defer close(paced); pace() }()
	var runErr error
	for range lc.Jobs {
		if runErr = collect(); runErr != nil {
			break
		}
	}
	if runErr != nil {
		// Drain the pacer so that the submitters end.
		for range work {
		}
	}
	<-paced
	wg.Wait()
	if runErr != nil {
		return Percentiles{}, runErr
	}
	return PercentilesOf(samples), nil
}

// StopToCancel measures, jobs times in a row, the time from issuing a stop
// for a running task (commands.Stop, as `worker stop` does: a command row
// and a notification) to the cancellation of its handler's context, on one
// node in this process holding every bucket.
func StopToCancel(ctx context.Context, s Store, cfg node.Config, jobs int, progress func(done int)) (Percentiles, error) {
	if jobs <= 0 {
		return Percentiles{}, fmt.Errorf("stop to cancel: %d jobs; give at least 1", jobs)
	}
	running := make(chan int64, 1)
	cancelled := make(chan time.Time, 1)
	n, err := startNode(ctx, s, cfg, BlockKind, func(hctx context.Context, t *task.Task) error {
		running <- t.ID
		<-hctx.Done()
		cancelled <- time.Now()
		return context.Cause(hctx)
	})
	if err != nil {
		return Percentiles{}, err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	wait := func(what string, id int64, cond func() (bool, error)) error {
		deadline := time.Now().Add(StallTimeout)
		for {
			ok, err := cond()
			if err != nil || ok {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("stop to cancel: task %d: not %s within %v", id, what, StallTimeout)
			}
			// A benchmark's pacing between runs, not part of what is measured.
			time.Sleep(time.Millisecond)
		}
	}
	samples := make([]time.Duration, 0, jobs)
	for i := range jobs {
		tk, err := n.Submit(ctx, node.SubmitRequest{Kind: BlockKind})
		if err != nil {
			return Percentiles{}, fmt.Errorf("stop to cancel: submit: %w", err)
		}
		select {
		case <-running:
		case <-time.After(StallTimeout):
			return Percentiles{}, fmt.Errorf("stop to cancel: task %d did not start within %v", tk.ID, StallTimeout)
		}
		t0 := time.Now()
		if _, err := commands.Stop(ctx, s, tk.ID, "benchmark", "benchmark"); err != nil {
			return Percentiles{}, fmt.Errorf("stop to cancel: stop task %d: %w", tk.ID, err)
		}
		select {
		case at := <-cancelled:
			samples = append(samples, at.Sub(t0))
		case <-time.After(StallTimeout):
			return Percentiles{}, fmt.Errorf("stop to cancel: task %d: handler not cancelled within %v", tk.ID, StallTimeout)
		}
		err = wait("stopped", tk.ID, func() (bool, error) {
			got, err := s.GetTask(ctx, tk.ID)
			return err == nil && got.Status == task.Stopped, err
		})
		if err != nil {
			return Percentiles{}, err
		}
		if progress != nil {
			progress(i + 1)
		}
	}
	return PercentilesOf(samples), nil
}

// startNode starts a node holding every bucket with one handler.
func startNode(ctx context.Context, s Store, cfg node.Config, kind string, h node.Handler) (*node.Node, error) {
	cfg.AllBuckets, cfg.Buckets = true, bucket.Set{}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	n, err := node.New(s, cfg)
	if err != nil {
		return nil, err
	}
	n.Register(kind, h)
	if err := n.Start(ctx); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	return n, nil
}
