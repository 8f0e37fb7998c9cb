// Typedhandler runs a handler of a payload struct and a result struct:
// flotilla.Handle decodes each task's payload into the struct, strictly,
// and stores what the handler returns as the task's result, which
// flotilla.ResultOf reads back typed.
//
// A payload with a field the struct does not have is a bad task, not a
// passing failure: it fails at its first attempt, with an error naming the
// field, and is not retried.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/typedhandler
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Resize is the payload of a resize task; its Kind names the handler.
type Resize struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

func (Resize) Kind() string { return "resize" }

// Thumbnail is what a resize task returns.
type Thumbnail struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

func resize(ctx context.Context, job *flotilla.Job[Resize]) (Thumbnail, error) {
	if job.Args.Width <= 0 {
		// Another attempt cannot fix the input: fail the task at once.
		return Thumbnail{}, task.NoRetry(fmt.Errorf("width %d: give a positive width", job.Args.Width))
	}
	fmt.Printf("handler: resizing %s to %dpx wide (attempt %d of %d)\n", job.Args.Image, job.Args.Width, job.Attempt, job.MaxAttempts)
	return Thumbnail{Name: fmt.Sprintf("%s@%dw", job.Args.Image, job.Args.Width), Bytes: job.Args.Width * 64}, nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "typedhandler:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	n, err := node.New(fleet.Store, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		return err
	}
	if err := flotilla.Handle(n, resize); err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	good, err := flotilla.SubmitArgs(ctx, fleet.Client, Resize{Image: "cat.png", Width: 128}, flotilla.WithKey("cat.png"))
	if err != nil {
		return err
	}
	thumb, err := flotilla.WaitResult[Thumbnail](ctx, fleet.Client, good.ID)
	if err != nil {
		return err
	}
	fmt.Printf("task %d succeeded: thumbnail %s, %d bytes\n", good.ID, thumb.Name, thumb.Bytes)

	// A payload the struct does not describe, as an older or a careless
	// submitter might send it.
	bad, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{
		Kind: "resize", Key: "dog.png", Payload: json.RawMessage(`{"image":"dog.png","height":64}`),
	})
	if err != nil {
		return err
	}
	failed, err := fleet.Client.Wait(ctx, bad.ID)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s after %d attempt(s) of %d: %s\n", failed.ID, failed.Status, failed.Attempt, failed.MaxAttempts, failed.Error)
	return n.Shutdown(ctx)
}
