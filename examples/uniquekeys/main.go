// Uniquekeys submits tasks with a unique key: while a task with the key is
// unfinished (waiting, running, paused, retrying), another with the same
// key is refused with store.ErrDuplicate, and nothing is written. Once the
// first has ended, the key is free again.
//
// Use it to make a submit idempotent, such as "charge invoice 7" sent twice
// by a retrying caller.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/uniquekeys
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
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Charge is the payload of a charge task.
type Charge struct {
	Invoice int `json:"invoice"`
}

func (Charge) Kind() string { return "charge" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "uniquekeys:", err)
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
	// charge holds its task running until main lets it finish, so that the
	// duplicate below arrives while the first is unfinished.
	running := make(chan int64, 1)
	finish := make(chan struct{})
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Charge]) (struct{}, error) {
		running <- job.ID
		select {
		case <-finish:
			return struct{}{}, nil
		case <-ctx.Done():
			return struct{}{}, context.Cause(ctx)
		}
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	charge := func() (*task.Task, error) {
		return flotilla.SubmitArgs(ctx, fleet.Client, Charge{Invoice: 7}, flotilla.WithKey("customer-9"),
			flotilla.WithUniqueKey("invoice-7"))
	}
	first, err := charge()
	if err != nil {
		return err
	}
	fmt.Printf("submitted task %d with unique key %s\n", first.ID, first.UniqueKey)
	select {
	case <-running:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	fmt.Printf("task %d is running\n", first.ID)

	_, err = charge()
	if !errors.Is(err, store.ErrDuplicate) {
		return fmt.Errorf("a second submit of unique key invoice-7 answered %v, want store.ErrDuplicate", err)
	}
	fmt.Printf("second submit refused: duplicate=%t: %v\n", errors.Is(err, store.ErrDuplicate), err)
	all, err := fleet.Client.List(ctx, store.TaskFilter{})
	if err != nil {
		return err
	}
	fmt.Printf("tasks in the fleet: %d\n", len(all))

	close(finish)
	if _, err := tempfleet.Wait(ctx, fleet.Client, first.ID, task.Succeeded); err != nil {
		return err
	}
	fmt.Printf("task %d succeeded; the key is free again\n", first.ID)
	again, err := charge()
	if err != nil {
		return err
	}
	if _, err := tempfleet.Wait(ctx, fleet.Client, again.ID, task.Succeeded); err != nil {
		return err
	}
	fmt.Printf("a new submit with unique key %s was accepted as task %d, and succeeded\n", again.UniqueKey, again.ID)
	return n.Shutdown(ctx)
}
