// Schedules declares a schedule in code, in node.Config.Schedules: the node
// creates it (or updates its definition) when it starts, and whichever node
// holds the schedule's bucket fires it. Here it fires every second; the
// example lets it fire twice, then exits.
//
// A schedule fires a task per tick; the task carries the schedule's name
// and the tick it was fired for. An operator's pause (`worker schedule
// pause`) outlives restarts: a node's declaration never resumes it.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/schedules
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/task"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "schedules:", err)
		os.Exit(1)
	}
}

// Refresh is the payload of the task each tick fires (none here).
type Refresh struct{}

func (Refresh) Kind() string { return "refresh" }

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	n, err := node.New(fleet.Store, node.Config{
		NodeID:     "node-1",
		AllBuckets: true,
		Schedules: []schedule.Definition{{
			Name: "refresh-cache",
			Cron: "@every 1s",
			Kind: Refresh{}.Kind(),
		}},
	})
	if err != nil {
		return err
	}
	fired := make(chan *task.Task, 10)
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Refresh]) (struct{}, error) {
		fired <- job.Task() // its schedule and the tick it was fired for
		return struct{}{}, nil
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	reports, err := fleet.Client.Schedules(ctx)
	if err != nil {
		return err
	}
	for _, r := range reports {
		fmt.Printf("schedule %s: %s, kind %s, bucket %d, fired by %s\n", r.Name, r.Spec, r.Kind, r.Bucket, r.Holder)
	}

	const ticks = 2
	for i := 1; i <= ticks; i++ {
		select {
		case t := <-fired:
			fmt.Printf("tick %d: task %d from schedule %s, for %s\n",
				i, t.ID, t.Schedule, t.ScheduledFor.UTC().Format(time.TimeOnly))
		case <-ctx.Done():
			return fmt.Errorf("waiting for tick %d: %w", i, context.Cause(ctx))
		}
	}
	if err := n.Shutdown(ctx); err != nil {
		return err
	}
	fmt.Printf("fired %d ticks; node shut down\n", ticks)
	return nil
}
