// Limits declares per-key flow control in node.Config.Limits: a
// concurrency limit (at most 2 exports running at once per customer) and a
// rate limit (at most 2 emails started per second per customer). A task
// counts under its LimitKey (its Key when it has none); the LimitKey also
// picks its bucket, so that the one holder of that bucket enforces the
// key's limits alone, in memory.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/limits
package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	exportsPerCustomer = 2
	exports            = 6
	emails             = 4
)

// gauge tracks how many handlers run at once per limit key, and the most
// it has seen.
type gauge struct {
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
}

func (g *gauge) enter(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[key]++
	g.most[key] = max(g.most[key], g.running[key])
	return g.running[key]
}

func (g *gauge) leave(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[key]--
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "limits:", err)
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
		NodeID:      "node-1",
		AllBuckets:  true,
		Concurrency: 50, // the node alone would run every export at once
		// A task that a limit holds back is started at a later claim
		// pass; a short poll makes the rate visible to the 100ms.
		PollInterval: 100 * time.Millisecond,
		Limits: []store.Limit{
			{Name: "exports-per-customer", Kind: "export", Per: store.PerKey, Concurrency: exportsPerCustomer},
			{Name: "emails-per-customer", Kind: "email", Per: store.PerKey, Rate: 2, Period: time.Second},
		},
	})
	if err != nil {
		return err
	}
	g := &gauge{running: map[string]int{}, most: map[string]int{}}
	n.Register("export", func(ctx context.Context, t *task.Task) error {
		now := g.enter(t.LimitKey)
		defer g.leave(t.LimitKey)
		fmt.Printf("export %s for %s started (%d running for %s)\n", t.Key, t.LimitKey, now, t.LimitKey)
		select {
		case <-time.After(200 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	var mu sync.Mutex
	var starts []time.Time
	n.Register("email", func(ctx context.Context, t *task.Task) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Now())
		return nil
	})
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	var reqs []flotilla.TaskRequest
	for i := 1; i <= exports; i++ {
		reqs = append(reqs, flotilla.TaskRequest{Kind: "export", Key: fmt.Sprintf("export-%d", i), LimitKey: "customer-a"})
	}
	for i := 1; i <= emails; i++ {
		reqs = append(reqs, flotilla.TaskRequest{Kind: "email", Key: fmt.Sprintf("email-%d", i), LimitKey: "customer-b"})
	}
	submitted, err := fleet.Client.SubmitMany(ctx, reqs)
	if err != nil {
		return err
	}
	fmt.Printf("submitted %d exports for customer-a and %d emails for customer-b\n", exports, emails)
	for _, t := range submitted {
		if _, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Succeeded); err != nil {
			return err
		}
	}

	most := g.most["customer-a"]
	if most > exportsPerCustomer {
		return fmt.Errorf("%d exports ran at once for customer-a, above the limit of %d", most, exportsPerCustomer)
	}
	fmt.Printf("all %d exports succeeded; never more than %d running at once for customer-a (most seen: %d)\n",
		exports, exportsPerCustomer, most)

	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("all %d emails succeeded; starts after the first, at 2 per second:", emails)
	for _, at := range starts[1:] {
		fmt.Printf(" +%v", at.Sub(starts[0]).Round(100*time.Millisecond))
	}
	fmt.Println()
	return nil
}
