// Retries shows what the node does with a handler that fails: it retries
// the task after a backoff while attempts remain, and a task whose attempt
// outlives its timeout has its context cancelled (cause node.ErrTimeout)
// and ends timed_out once its attempts are used up.
//
// The backoff is full jitter: attempt n waits a random time up to
// BackoffBase × 2^(n-1), capped at BackoffMax. This example makes both
// short so that it ends in seconds.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/retries
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Flaky is a report whose upstream fails its first two attempts.
type Flaky struct {
	Report string `json:"report"`
}

func (Flaky) Kind() string { return "flaky" }

// Slow is a report that takes longer than its timeout.
type Slow struct {
	Report string `json:"report"`
}

func (Slow) Kind() string { return "slow" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "retries:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	n, err := node.New(fleet.Store, node.Config{
		NodeID:       "node-1",
		AllBuckets:   true,
		BackoffBase:  100 * time.Millisecond,
		BackoffMax:   400 * time.Millisecond,
		PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	// flaky fails its first two attempts, then succeeds.
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Flaky]) (struct{}, error) {
		if job.Attempt <= 2 {
			fmt.Printf("flaky: attempt %d fails\n", job.Attempt)
			return struct{}{}, fmt.Errorf("upstream unavailable (attempt %d)", job.Attempt)
		}
		fmt.Printf("flaky: attempt %d succeeds\n", job.Attempt)
		return struct{}{}, nil
	})
	if err != nil {
		return err
	}
	// slow takes longer than its timeout; it returns when its context ends.
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Slow]) (struct{}, error) {
		<-ctx.Done()
		cause := context.Cause(ctx)
		fmt.Printf("slow: attempt %d cancelled: timeout=%t\n", job.Attempt, errors.Is(cause, node.ErrTimeout))
		return struct{}{}, cause
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	flaky, err := flotilla.SubmitArgs(ctx, fleet.Client, Flaky{Report: "report-1"}, flotilla.WithKey("report-1"),
		flotilla.WithMaxAttempts(5))
	if err != nil {
		return err
	}
	done, err := tempfleet.Wait(ctx, fleet.Client, flaky.ID, task.Succeeded)
	if err != nil {
		return err
	}
	fmt.Printf("task %d (flaky) %s at attempt %d of %d\n", done.ID, done.Status, done.Attempt, done.MaxAttempts)
	if err := printTrail(ctx, fleet.Client, done.ID); err != nil {
		return err
	}

	slow, err := flotilla.SubmitArgs(ctx, fleet.Client, Slow{Report: "report-2"}, flotilla.WithKey("report-2"),
		flotilla.WithMaxAttempts(2), flotilla.WithTimeout(300*time.Millisecond))
	if err != nil {
		return err
	}
	timedOut, err := tempfleet.Wait(ctx, fleet.Client, slow.ID, task.TimedOut)
	if err != nil {
		return err
	}
	fmt.Printf("task %d (slow) %s after %d attempts: %s\n", timedOut.ID, timedOut.Status, timedOut.Attempt, timedOut.Error)
	if err := printTrail(ctx, fleet.Client, timedOut.ID); err != nil {
		return err
	}
	return n.Shutdown(ctx)
}

func printTrail(ctx context.Context, c *flotilla.Client, id int64) error {
	r, err := c.Report(ctx, id)
	if err != nil {
		return err
	}
	for _, e := range r.Events {
		from := string(e.From)
		if from == "" {
			from = "(new)"
		}
		line := fmt.Sprintf("  %s -> %s", from, e.To)
		if e.Error != "" {
			line += fmt.Sprintf(" (%s)", e.Error)
		}
		fmt.Println(line)
	}
	return nil
}
