package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// waitStatus reads task id until it is in state want.
func waitStatus(ctx context.Context, s store.Store, id int64, want task.Status) (*task.Task, error) {
	for {
		t, err := s.GetTask(ctx, id)
		if err != nil || t.Status == want {
			return t, err
		}
		if t.Status.Terminal() {
			return t, fmt.Errorf("task %d ended %s, not %s", id, t.Status, want)
		}
		select {
		case <-ctx.Done():
			return t, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A node joins the fleet with Start, runs the kinds registered with it in
// the buckets it holds, and leaves with Shutdown, which lets running
// handlers finish and hands its buckets over.
func ExampleNew() {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}

	n, err := node.New(s, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		panic(err)
	}
	n.Register("greet", func(ctx context.Context, t *task.Task) error {
		fmt.Printf("hello, %s\n", t.Payload)
		return nil
	})
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%s holds %d buckets\n", n.ID(), len(n.Held()))

	t, err := n.Submit(ctx, node.SubmitRequest{Kind: "greet", Key: "user-1", Payload: json.RawMessage(`"Ada"`)})
	if err != nil {
		panic(err)
	}
	done, err := waitStatus(ctx, s, t.ID, task.Succeeded)
	if err != nil {
		panic(err)
	}
	fmt.Printf("task %d %s\n", done.ID, done.Status)

	if err := n.Shutdown(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%s holds %d buckets after Shutdown\n", n.ID(), len(n.Held()))
	// Output:
	// node-1 holds 16 buckets
	// hello, "Ada"
	// task 1 succeeded
	// node-1 holds 0 buckets after Shutdown
}

// A handler that can be paused calls t.Checkpoint between steps: when a
// pause was requested, it saves its progress with t.SaveProgress and
// returns task.ErrPaused. After a resume, the next attempt reads the saved
// progress from t.Progress. The handler's result, set on t.Result, is
// stored with its success.
func ExampleHandler() {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		panic(err)
	}
	n, err := node.New(s, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		panic(err)
	}

	// Attempt 1 stops after the first photo until the example has asked
	// for a pause, so that the pause lands at a known step.
	firstDone, goOn := make(chan struct{}), make(chan struct{})
	type progress struct {
		Done int `json:"done"`
	}
	n.Register("resize-album", func(ctx context.Context, t *task.Task) error {
		var p progress
		if len(t.Progress) > 0 {
			if err := json.Unmarshal(t.Progress, &p); err != nil {
				return task.NoRetry(err)
			}
			fmt.Printf("attempt %d resumes after photo %d\n", t.Attempt, p.Done)
		}
		for p.Done < 3 {
			if err := t.Checkpoint(ctx); errors.Is(err, task.ErrPaused) {
				saved, _ := json.Marshal(p)
				if err := t.SaveProgress(ctx, saved); err != nil {
					return err
				}
				fmt.Printf("attempt %d pauses after photo %d\n", t.Attempt, p.Done)
				return task.ErrPaused
			}
			p.Done++
			fmt.Printf("attempt %d resized photo %d\n", t.Attempt, p.Done)
			if t.Attempt == 1 && p.Done == 1 {
				close(firstDone)
				<-goOn
			}
		}
		t.Result = json.RawMessage(fmt.Sprintf(`{"resized":%d}`, p.Done))
		return nil
	})
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = n.Shutdown(ctx) }()

	t, err := c.Submit(ctx, flotilla.TaskRequest{Kind: "resize-album", Key: "album-7"})
	if err != nil {
		panic(err)
	}
	<-firstDone
	r, err := c.Pause(ctx, t.ID, flotilla.By("example"))
	if err != nil {
		panic(err)
	}
	// The node has told the attempt once it acknowledges the command.
	if _, _, err := c.WaitCommand(ctx, r.Command.ID, 5*time.Millisecond); err != nil {
		panic(err)
	}
	close(goOn)
	paused, err := waitStatus(ctx, s, t.ID, task.Paused)
	if err != nil {
		panic(err)
	}
	fmt.Printf("task %s, progress %s\n", paused.Status, paused.Progress)

	if _, err := c.Resume(ctx, t.ID, flotilla.By("example")); err != nil {
		panic(err)
	}
	done, err := waitStatus(ctx, s, t.ID, task.Succeeded)
	if err != nil {
		panic(err)
	}
	fmt.Printf("task %s, result %s\n", done.Status, done.Result)
	// Output:
	// attempt 1 resized photo 1
	// attempt 1 pauses after photo 1
	// task paused, progress {"done":1}
	// attempt 2 resumes after photo 1
	// attempt 2 resized photo 2
	// attempt 2 resized photo 3
	// task succeeded, result {"resized":3}
}
