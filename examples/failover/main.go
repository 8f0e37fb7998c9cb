// Failover runs three nodes in one program, each holding buckets of its
// own, and shows a task surviving the loss of the node that ran it: the
// standby of its bucket takes the bucket over once the lease has lapsed,
// under a new epoch that fences the old attempt, and runs the task again.
//
//	node-a declares buckets 0-5
//	node-b declares buckets 0-10: it holds 6-10, and stands by for 0-5
//	node-c declares buckets 11-15
//
// The library has no way to kill a node in-process short of killing the
// process, so node-a's handler hangs, as a stuck process would, and node-a
// is shut down with a context that has already ended: Shutdown abandons
// the hung handler and leaves the lease of its bucket to lapse, as after a
// crash (node-a's other buckets are released and taken over at once). The
// leases here last 3s, so that the example ends in seconds; the default is
// 15s.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/failover
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

const leaseTTL = 3 * time.Second

// Invoice is the payload of an invoice task.
type Invoice struct {
	Customer string `json:"customer"`
}

func (Invoice) Kind() string { return "invoice" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	// hang keeps node-a's handler stuck until the example ends.
	hang := make(chan struct{})
	defer close(hang)
	startedOnA := make(chan int64, 1)

	nodes := map[string]*node.Node{}
	for _, spec := range []struct{ id, buckets string }{
		{"node-a", "0-5"}, {"node-b", "0-10"}, {"node-c", "11-15"},
	} {
		set, err := bucket.ParseSet(spec.buckets, tempfleet.NumBuckets)
		if err != nil {
			return err
		}
		n, err := node.New(fleet.Store, node.Config{
			NodeID:         spec.id,
			Buckets:        set,
			BucketLeaseTTL: leaseTTL,
			TaskLeaseTTL:   leaseTTL,
			PollInterval:   100 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		id := spec.id
		err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Invoice]) (struct{}, error) {
			epoch := job.Task().Epoch // the bucket's epoch this attempt runs under
			if id == "node-a" {
				fmt.Printf("%s: running task %d (attempt %d, epoch %d), then hanging\n", id, job.ID, job.Attempt, epoch)
				startedOnA <- job.ID
				<-hang
				return struct{}{}, nil
			}
			fmt.Printf("%s: running task %d (attempt %d, epoch %d) to the end\n", id, job.ID, job.Attempt, epoch)
			return struct{}{}, nil
		})
		if err != nil {
			return err
		}
		// Started one after the other, so that node-a holds 0-5 before
		// node-b, which also declares them, joins.
		if err := n.Start(ctx); err != nil {
			return err
		}
		defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()
		nodes[id] = n
		fmt.Printf("%s declares %s and holds %s\n", id, spec.buckets, held(n))
	}

	// A key in one of node-a's buckets.
	policy := fleet.Client.Policy()
	var key string
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("customer-%d", i); policy.Of(k) <= 5 {
			key = k
		}
	}
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Invoice{Customer: key}, flotilla.WithKey(key))
	if err != nil {
		return err
	}
	fmt.Printf("submitted task %d with key %s, in bucket %d\n", t.ID, key, t.Bucket)
	select {
	case <-startedOnA:
	case <-ctx.Done():
		return context.Cause(ctx)
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	stoppedAt := time.Now()
	err = nodes["node-a"].Shutdown(ended)
	fmt.Printf("node-a stops abruptly; its handler is abandoned: %v\n", err != nil)

	if err := waitHolder(ctx, fleet.Client, t.Bucket, "node-b"); err != nil {
		return err
	}
	fmt.Printf("node-b took bucket %d over once its lease had lapsed (%v after the stop; lease TTL %v)\n",
		t.Bucket, time.Since(stoppedAt).Round(100*time.Millisecond), leaseTTL)

	done, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Succeeded)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s on %s at attempt %d\n", done.ID, done.Status, done.Node, done.Attempt)
	r, err := fleet.Client.Report(ctx, t.ID)
	if err != nil {
		return err
	}
	fmt.Println("audit trail:")
	for _, e := range r.Events {
		if e.From == "" {
			continue
		}
		line := fmt.Sprintf("  %s -> %s", e.From, e.To)
		if e.Node != "" {
			line += fmt.Sprintf(" on %s, epoch %d", e.Node, e.Epoch)
		}
		if e.Reason != "" {
			line += ": " + e.Reason
		}
		fmt.Println(line)
	}
	fmt.Printf("node-b now holds %s; node-c holds %s\n", held(nodes["node-b"]), held(nodes["node-c"]))
	return nil
}

// held lists the buckets a node holds.
func held(n *node.Node) bucket.Set {
	var bs []int
	for _, h := range n.Held() {
		bs = append(bs, h.Bucket)
	}
	return bucket.Of(bs...)
}

// waitHolder waits until node id holds bucket b.
func waitHolder(ctx context.Context, c *flotilla.Client, b int, id string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		reports, err := c.Buckets(ctx)
		if err != nil {
			return err
		}
		if reports[b].Holder == id {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bucket %d is still held by %q, not %s: %w", b, reports[b].Holder, id, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
