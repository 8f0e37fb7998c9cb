// Typedhandler runs a handler that takes a payload struct and returns a
// result struct, both as JSON.
//
// The library's handler API is untyped (node.Handler gets the payload as
// JSON and sets t.Result as JSON), so this example writes a small generic
// adapter, typed, of its own: it decodes the payload strictly, fails a
// payload that does not decode at once (task.NoRetry: another attempt
// cannot fix it), and encodes the result. Copy it into your code if it
// suits you.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/typedhandler
package main

import (
	"bytes"
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

// ResizeRequest is the payload of a resize task.
type ResizeRequest struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

// ResizeResult is its result.
type ResizeResult struct {
	Thumbnail string `json:"thumbnail"`
	Bytes     int    `json:"bytes"`
}

// typed adapts a function of a payload P and a result R to node.Handler.
func typed[P, R any](fn func(ctx context.Context, t *task.Task, p P) (R, error)) node.Handler {
	return func(ctx context.Context, t *task.Task) error {
		var p P
		dec := json.NewDecoder(bytes.NewReader(t.Payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return task.NoRetry(fmt.Errorf("payload %s does not decode into %T: %w", t.Payload, p, err))
		}
		r, err := fn(ctx, t, p)
		if err != nil {
			return err
		}
		out, err := json.Marshal(r)
		if err != nil {
			return task.NoRetry(fmt.Errorf("result %T does not encode: %w", r, err))
		}
		t.Result = out
		return nil
	}
}

func resize(ctx context.Context, t *task.Task, req ResizeRequest) (ResizeResult, error) {
	if req.Width <= 0 {
		return ResizeResult{}, task.NoRetry(fmt.Errorf("width %d: give a positive width", req.Width))
	}
	fmt.Printf("handler: resizing %s to %dpx wide\n", req.Image, req.Width)
	return ResizeResult{Thumbnail: fmt.Sprintf("%s@%dw", req.Image, req.Width), Bytes: req.Width * 64}, nil
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
	n.Register("resize", typed(resize))
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	payload, err := json.Marshal(ResizeRequest{Image: "cat.png", Width: 128})
	if err != nil {
		return err
	}
	good, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{Kind: "resize", Key: "cat.png", Payload: payload})
	if err != nil {
		return err
	}
	done, err := tempfleet.Wait(ctx, fleet.Client, good.ID, task.Succeeded)
	if err != nil {
		return err
	}
	var res ResizeResult
	if err := json.Unmarshal(done.Result, &res); err != nil {
		return err
	}
	fmt.Printf("task %d %s: thumbnail %s, %d bytes\n", done.ID, done.Status, res.Thumbnail, res.Bytes)

	// A payload the struct does not describe fails at its first attempt,
	// without retries.
	bad, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{
		Kind: "resize", Key: "dog.png", Payload: json.RawMessage(`{"image":"dog.png","height":64}`),
	})
	if err != nil {
		return err
	}
	failed, err := tempfleet.Wait(ctx, fleet.Client, bad.ID, task.Failed)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s after %d attempt(s) of %d: %s\n", failed.ID, failed.Status, failed.Attempt, failed.MaxAttempts, failed.Error)
	return n.Shutdown(ctx)
}
