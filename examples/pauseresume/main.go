// Pauseresume pauses a running task at its handler's checkpoint, resumes
// it from the progress it saved, and stops another one.
//
// A pause is cooperative: the handler calls t.Checkpoint between steps, and
// when a pause was requested it saves its progress (t.SaveProgress) and
// returns task.ErrPaused. The next attempt, after a resume, reads that
// progress from t.Progress. A stop is not: it cancels the handler's context
// with the cause node.ErrStopRequested.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/pauseresume
package main

import (
	"context"
	"encoding/json"
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

// progress is what a copy task saves between attempts.
type progress struct {
	Done int `json:"done"`
}

// stepStarted says that task ID began step Step.
type stepStarted struct {
	ID   int64
	Step int
}

// copyFiles copies steps files, one every 100ms, checkpointing between
// them. started is told of each step as it begins, so that main knows the
// task is well under way before it pauses it.
func copyFiles(started chan<- stepStarted) node.Handler {
	return func(ctx context.Context, t *task.Task) error {
		var p progress
		if len(t.Progress) > 0 {
			if err := json.Unmarshal(t.Progress, &p); err != nil {
				return task.NoRetry(fmt.Errorf("saved progress %s: %w", t.Progress, err))
			}
			fmt.Printf("copy: attempt %d resumes after file %d\n", t.Attempt, p.Done)
		}
		for p.Done < steps {
			if err := t.Checkpoint(ctx); errors.Is(err, task.ErrPaused) {
				saved, _ := json.Marshal(p)
				if err := t.SaveProgress(ctx, saved); err != nil {
					return err
				}
				fmt.Printf("copy: pause requested; saved progress %s\n", saved)
				return task.ErrPaused
			}
			select {
			case started <- stepStarted{ID: t.ID, Step: p.Done + 1}:
			default:
			}
			select {
			case <-ctx.Done():
				cause := context.Cause(ctx)
				fmt.Printf("copy: task %d cancelled at file %d: stop requested=%t\n",
					t.ID, p.Done+1, errors.Is(cause, node.ErrStopRequested))
				return cause
			case <-time.After(100 * time.Millisecond):
			}
			p.Done++
		}
		t.Result = json.RawMessage(fmt.Sprintf(`{"copied":%d}`, p.Done))
		return nil
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
	started := make(chan stepStarted, 1)
	n.Register("copy", copyFiles(started))
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	// Pause, then resume.
	t, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{Kind: "copy", Key: "backup-1"})
	if err != nil {
		return err
	}
	if err := waitForStep(ctx, started, t.ID, 3); err != nil {
		return err
	}
	if _, err := fleet.Client.Pause(ctx, t.ID, "maintenance window", "example"); err != nil {
		return err
	}
	paused, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Paused)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s with progress %s\n", paused.ID, paused.Status, paused.Progress)
	if _, err := fleet.Client.Resume(ctx, t.ID, "window over", "example"); err != nil {
		return err
	}
	done, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Succeeded)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s at attempt %d with result %s\n", done.ID, done.Status, done.Attempt, done.Result)

	// Stop.
	t, err = fleet.Client.Submit(ctx, flotilla.TaskRequest{Kind: "copy", Key: "backup-2"})
	if err != nil {
		return err
	}
	if err := waitForStep(ctx, started, t.ID, 2); err != nil {
		return err
	}
	if _, err := fleet.Client.Stop(ctx, t.ID, "no longer needed", "example"); err != nil {
		return err
	}
	stopped, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Stopped)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s\n", stopped.ID, stopped.Status)
	return n.Shutdown(ctx)
}

// waitForStep waits until copy task id begins step want.
func waitForStep(ctx context.Context, started <-chan stepStarted, id int64, want int) error {
	for {
		select {
		case got := <-started:
			if got.ID == id && got.Step >= want {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for step %d: %w", want, context.Cause(ctx))
		}
	}
}
