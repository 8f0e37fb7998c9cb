// Pauseresume pauses a running task at its handler's checkpoint, resumes
// it from the progress it saved, and stops another one.
//
// A pause is cooperative: the handler calls job.Checkpoint between steps,
// and when a pause was requested it saves its progress (job.SaveProgress)
// and returns task.ErrPaused. The next attempt, after a resume, reads that
// progress with job.Progress. A stop is not: it cancels the handler's context
// with the cause node.ErrStopRequested.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/pauseresume
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

// steps is how many steps a copy task has.
const steps = 10

// Copy is the payload of a copy task: the backup it copies.
type Copy struct {
	Backup string `json:"backup"`
}

func (Copy) Kind() string { return "copy" }

// Copied is what a copy task returns.
type Copied struct {
	Copied int `json:"copied"`
}

// progress is what a copy task saves between attempts.
type progress struct {
	Done int `json:"done"`
}

// hold is where a copy task's first attempt waits, once it has copied
// After files, until main lets it go on: main asks for a pause or a stop
// while the task waits at a known file, so that the story is the same on a
// loaded machine.
type hold struct {
	After   int
	reached chan struct{}
	release chan struct{}
}

func newHold(after int) *hold {
	return &hold{After: after, reached: make(chan struct{}), release: make(chan struct{})}
}

// copyFiles copies steps files, one every 100ms, checkpointing before each.
// holds says where the tasks of some backups wait for main.
func copyFiles(holds map[string]*hold) func(context.Context, *flotilla.Job[Copy]) (Copied, error) {
	return func(ctx context.Context, job *flotilla.Job[Copy]) (Copied, error) {
		var p progress
		resumed, err := job.Progress(&p)
		if err != nil {
			return Copied{}, task.NoRetry(err)
		}
		if resumed {
			fmt.Printf("copy: attempt %d resumes after file %d\n", job.Attempt, p.Done)
		}
		for p.Done < steps {
			if h := holds[job.Args.Backup]; h != nil && job.Attempt == 1 && p.Done == h.After {
				close(h.reached)
				if err := wait(ctx, job.ID, p, h.release); err != nil {
					return Copied{}, err
				}
			}
			if err := job.Checkpoint(ctx); errors.Is(err, task.ErrPaused) {
				if err := job.SaveProgress(ctx, p); err != nil {
					return Copied{}, err
				}
				fmt.Printf("copy: pause requested; saved progress {\"done\":%d}\n", p.Done)
				return Copied{}, task.ErrPaused
			}
			if err := wait(ctx, job.ID, p, time.After(100*time.Millisecond)); err != nil { // the copy itself
				return Copied{}, err
			}
			p.Done++
		}
		return Copied{Copied: p.Done}, nil
	}
}

// wait waits for done, or for the attempt's context to end: a stop.
func wait[T any](ctx context.Context, id int64, p progress, done <-chan T) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		cause := context.Cause(ctx)
		fmt.Printf("copy: task %d cancelled after file %d: stop requested=%t\n",
			id, p.Done, errors.Is(cause, node.ErrStopRequested))
		return cause
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pauseresume:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	// Commands reach the running node through notifications, and through
	// polling should one be missed.
	n, err := node.New(fleet.Store, node.Config{NodeID: "node-1", AllBuckets: true, CommandPoll: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	holds := map[string]*hold{"backup-1": newHold(3), "backup-2": newHold(2)}
	if err := flotilla.Handle(n, copyFiles(holds)); err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	// Pause, then resume.
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Copy{Backup: "backup-1"}, flotilla.WithKey("backup-1"))
	if err != nil {
		return err
	}
	if err := reach(ctx, holds["backup-1"]); err != nil {
		return err
	}
	r, err := fleet.Client.Pause(ctx, t.ID, flotilla.Reason("maintenance window"), flotilla.By("example"))
	if err != nil {
		return err
	}
	// The node acknowledges the pause once it has told the attempt, whose
	// next checkpoint then answers task.ErrPaused.
	if _, _, err := fleet.Client.WaitCommand(ctx, r.Command.ID, 20*time.Millisecond); err != nil {
		return err
	}
	close(holds["backup-1"].release)
	paused, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Paused)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s with progress %s\n", paused.ID, paused.Status, paused.Progress)
	if _, err := fleet.Client.Resume(ctx, t.ID, flotilla.Reason("window over"), flotilla.By("example")); err != nil {
		return err
	}
	done, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Succeeded)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s at attempt %d with result %s\n", done.ID, done.Status, done.Attempt, done.Result)

	// Stop.
	t, err = flotilla.SubmitArgs(ctx, fleet.Client, Copy{Backup: "backup-2"}, flotilla.WithKey("backup-2"))
	if err != nil {
		return err
	}
	if err := reach(ctx, holds["backup-2"]); err != nil {
		return err
	}
	if _, err := fleet.Client.Stop(ctx, t.ID, flotilla.Reason("no longer needed"), flotilla.By("example")); err != nil {
		return err
	}
	stopped, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Stopped)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s\n", stopped.ID, stopped.Status)
	return n.Shutdown(ctx)
}

// reach waits until a task has reached its hold.
func reach(ctx context.Context, h *hold) error {
	select {
	case <-h.reached:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a task to copy file %d: %w", h.After, context.Cause(ctx))
	}
}
