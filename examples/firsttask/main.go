// Firsttask runs a first task on a node and prints its audit trail: every
// transition the task went through, as the database recorded it.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/firsttask
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
)

// Greet is a task's payload: a Go type whose Kind names its handler.
type Greet struct {
	Name string `json:"name"`
}

func (Greet) Kind() string { return "greet" }

// Greeting is what a greet task returns, stored as its result.
type Greeting struct {
	Greeted string `json:"greeted"`
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "firsttask:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	// One node serving every bucket, running one kind of task.
	n, err := node.New(fleet.Store, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		return err
	}
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Greet]) (Greeting, error) {
		fmt.Printf("handler: hello, %s (task %d, attempt %d)\n", job.Args.Name, job.ID, job.Attempt)
		return Greeting{Greeted: job.Args.Name}, nil
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()
	fmt.Printf("node %s started, holding %d buckets\n", n.ID(), len(n.Held()))

	// The client routes the task by its key to the key's bucket.
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Greet{Name: "Ada"}, flotilla.WithKey("user-42"))
	if err != nil {
		return err
	}
	fmt.Printf("submitted task %d (kind %s, key %s, bucket %d): %s\n", t.ID, t.Kind, t.Key, t.Bucket, t.Status)

	done, err := fleet.Client.Wait(ctx, t.ID)
	if err != nil {
		return err
	}
	greeting, err := flotilla.ResultOf[Greeting](done)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s with result %s: greeted %s\n", done.ID, done.Status, done.Result, greeting.Greeted)

	// The audit trail: one event per transition, written in the same
	// transaction as the transition itself.
	report, err := fleet.Client.Report(ctx, t.ID)
	if err != nil {
		return err
	}
	fmt.Println("audit trail:")
	for _, e := range report.Events {
		from := string(e.From)
		if from == "" {
			from = "(new)"
		}
		line := fmt.Sprintf("  %d. %s -> %s", e.Seq, from, e.To)
		if e.Node != "" {
			line += fmt.Sprintf(" on %s, epoch %d, attempt %d", e.Node, e.Epoch, e.Attempt)
		}
		fmt.Println(line)
	}
	if err := n.Shutdown(ctx); err != nil {
		return err
	}
	fmt.Println("node shut down")
	return nil
}
