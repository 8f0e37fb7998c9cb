// Limits declares flow control in node.Config.Limits and node.Config.Capacity,
// on two nodes that split the fleet's buckets between them:
//
//	node-1 holds buckets 0-7 and has one gpu (Capacity gpu=1)
//	node-2 holds buckets 8-15 and declares no capacity
//
// Both run every kind and declare the same limits:
//
//   - per key: at most 2 exports running at once per customer, and at most 2
//     emails started per second per customer. A task counts under its
//     LimitKey (its Key when it has none); the LimitKey also picks its
//     bucket, so that the one holder of that bucket enforces the key's
//     limits alone, in memory.
//   - fleet-wide: at most 2 renders running at once in the whole fleet,
//     whichever node holds their buckets. No node sees the other's tasks:
//     the holders share the 2 slots by quota, through the database.
//   - resources: a train task needs gpu=1, and a node starts it only when
//     that much of its capacity is free. Resources do not route a task: its
//     key puts it in a bucket, and only that bucket's holder can run it, so
//     the train tasks are given keys in node-1's buckets.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/limits
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	exportsPerCustomer = 2
	exports            = 6
	emails             = 4
	rendersInFleet     = 2
	rendersPerNode     = 3
	trains             = 3
)

var limits = []store.Limit{
	{Name: "exports-per-customer", Kind: "export", Per: store.PerKey, Concurrency: exportsPerCustomer},
	{Name: "emails-per-customer", Kind: "email", Per: store.PerKey, Rate: 2, Period: time.Second},
	{Name: "renders", Kind: "render", Per: store.PerFleet, Concurrency: rendersInFleet},
}

// gauge tracks how many handlers run at once under each name (a limit key,
// or a whole kind across both nodes), and the most it has seen.
type gauge struct {
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
}

func (g *gauge) enter(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[name]++
	g.most[name] = max(g.most[name], g.running[name])
	return g.running[name]
}

func (g *gauge) leave(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[name]--
}

func (g *gauge) mostSeen(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.most[name]
}

// busy is a handler's work: d, or less when its context ends.
func busy(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "limits:", err)
		os.Exit(1)
	}
}

// The kinds of task, each a payload type (none needs a field here).
type (
	Export struct{}
	Email  struct{}
	Render struct{}
	Train  struct{}
)

func (Export) Kind() string { return "export" }
func (Email) Kind() string  { return "email" }
func (Render) Kind() string { return "render" }
func (Train) Kind() string  { return "train" }

// batch collects requests for one SubmitMany, and the first error met
// building one.
type batch struct {
	reqs []flotilla.TaskRequest
	err  error
}

func add[T flotilla.Args](b *batch, args T, opts ...flotilla.SubmitOption) {
	r, err := flotilla.NewRequest(args, opts...)
	b.reqs = append(b.reqs, r)
	b.err = errors.Join(b.err, err)
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	policy := fleet.Client.Policy()
	half := tempfleet.NumBuckets / 2
	specs := []struct {
		id       string
		buckets  bucket.Set
		capacity store.Resources
	}{
		{"node-1", bucket.Of(seq(0, half)...), store.Resources{"gpu": 1}},
		{"node-2", bucket.Of(seq(half, tempfleet.NumBuckets)...), nil},
	}

	// A train task that needs two gpus, more than any node has: it waits
	// for ever. It is submitted before node-1 starts so that node-1's
	// first refresh of its limits, as it starts, writes on its row why it
	// waits. A task that starts waiting later gets that reason at a later
	// refresh. Nobody holds its bucket yet, nor runs its kind there, so the
	// client is told to skip those checks.
	//
	// It is first in line, and holds back none of the train tasks behind
	// it: a task that needs more than its node has in all never starts
	// there, and counts for nothing. (One that could start once enough is
	// free keeps its place: those behind it wait rather than take, one at
	// a time, what it waits for.)
	bigKey := keysIn(policy, specs[0].buckets, "big-model", 1)[0]
	big, err := flotilla.SubmitArgs(ctx, fleet.Client, Train{}, flotilla.WithKey(bigKey),
		flotilla.WithResources(store.Resources{"gpu": 2}), flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
	if err != nil {
		return err
	}

	g := &gauge{running: map[string]int{}, most: map[string]int{}}
	var mu sync.Mutex
	var starts []time.Time
	for _, spec := range specs {
		n, err := node.New(fleet.Store, node.Config{
			NodeID:      spec.id,
			Buckets:     spec.buckets,
			Capacity:    spec.capacity,
			Concurrency: 50, // a node alone would run every export and render at once
			// A task that a limit holds back is started at a later claim
			// pass; a short poll makes the rate visible to the 100ms.
			PollInterval: 100 * time.Millisecond,
			Limits:       limits, // the same on every node: each start upserts them
		})
		if err != nil {
			return err
		}
		id := spec.id
		err = errors.Join(
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Export]) (struct{}, error) {
				customer := job.Task().LimitKey
				now := g.enter(customer)
				defer g.leave(customer)
				fmt.Printf("export %s for %s started (%d running for %s)\n", job.Key, customer, now, customer)
				return struct{}{}, busy(ctx, 200*time.Millisecond)
			}),
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Email]) (struct{}, error) {
				mu.Lock()
				defer mu.Unlock()
				starts = append(starts, time.Now())
				return struct{}{}, nil
			}),
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Render]) (struct{}, error) {
				now := g.enter("render")
				defer g.leave("render")
				fmt.Printf("render %s started on %s (%d running in the fleet)\n", job.Key, id, now)
				return struct{}{}, busy(ctx, 150*time.Millisecond)
			}),
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Train]) (struct{}, error) {
				now := g.enter("gpu-" + id)
				defer g.leave("gpu-" + id)
				fmt.Printf("train %s started on %s (%d running there)\n", job.Key, id, now)
				return struct{}{}, busy(ctx, 100*time.Millisecond)
			}),
		)
		if err != nil {
			return err
		}
		if err := n.Start(ctx); err != nil {
			return err
		}
		defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()
		capacity := "no capacity"
		if len(spec.capacity) > 0 {
			capacity = "capacity " + spec.capacity.String()
		}
		fmt.Printf("%s holds buckets %s, %s\n", id, spec.buckets, capacity)
	}

	var b batch
	for i := 1; i <= exports; i++ {
		add(&b, Export{}, flotilla.WithKey(fmt.Sprintf("export-%d", i)), flotilla.WithLimitKey("customer-a"))
	}
	for i := 1; i <= emails; i++ {
		add(&b, Email{}, flotilla.WithKey(fmt.Sprintf("email-%d", i)), flotilla.WithLimitKey("customer-b"))
	}
	// Renders in both nodes' buckets, so that both want the fleet's slots.
	for _, spec := range specs {
		for _, key := range keysIn(policy, spec.buckets, "scene", rendersPerNode) {
			add(&b, Render{}, flotilla.WithKey(key))
		}
	}
	// Train tasks in node-1's buckets: node-1 has the gpu.
	for _, key := range keysIn(policy, specs[0].buckets, "model", trains) {
		add(&b, Train{}, flotilla.WithKey(key), flotilla.WithResources(store.Resources{"gpu": 1}))
	}
	if b.err != nil {
		return b.err
	}
	submitted, err := fleet.Client.SubmitMany(ctx, b.reqs)
	if err != nil {
		return err
	}
	fmt.Printf("submitted %d exports for customer-a, %d emails for customer-b, %d renders (%d in each node's buckets) "+
		"and %d train tasks needing gpu=1 (in node-1's buckets)\n",
		exports, emails, 2*rendersPerNode, rendersPerNode, trains)
	ranOn := map[string]map[string]int{} // kind -> node -> tasks
	for _, t := range submitted {
		done, err := tempfleet.Wait(ctx, fleet.Client, t.ID, task.Succeeded)
		if err != nil {
			return err
		}
		if ranOn[done.Kind] == nil {
			ranOn[done.Kind] = map[string]int{}
		}
		ranOn[done.Kind][done.Node]++
	}

	most := g.mostSeen("customer-a")
	if most > exportsPerCustomer {
		return fmt.Errorf("%d exports ran at once for customer-a, above the limit of %d", most, exportsPerCustomer)
	}
	fmt.Printf("all %d exports succeeded; never more than %d running at once for customer-a (most seen: %d)\n",
		exports, exportsPerCustomer, most)

	mu.Lock()
	fmt.Printf("all %d emails succeeded; starts after the first, at 2 per second:", emails)
	for _, at := range starts[1:] {
		fmt.Printf(" +%v", at.Sub(starts[0]).Round(100*time.Millisecond))
	}
	fmt.Println()
	mu.Unlock()

	// How the two slots were split between the nodes depends on when each
	// took its share; the total never exceeds them.
	most = g.mostSeen("render")
	if most > rendersInFleet {
		return fmt.Errorf("%d renders ran at once in the fleet, above the limit of %d", most, rendersInFleet)
	}
	fmt.Printf("all %d renders succeeded (%d on node-1, %d on node-2); never more than %d running at once "+
		"in the fleet (most seen: %d)\n",
		2*rendersPerNode, ranOn["render"]["node-1"], ranOn["render"]["node-2"], rendersInFleet, most)

	most = g.mostSeen("gpu-node-1")
	if ranOn["train"]["node-1"] != trains || most > 1 {
		return fmt.Errorf("train tasks: %v by node, %d at once on node-1; want all %d on node-1, one at a time",
			ranOn["train"], most, trains)
	}
	fmt.Printf("all %d train tasks succeeded on node-1, one at a time for its one gpu (most seen: %d)\n", trains, most)

	waiting, err := waitReason(ctx, fleet.Client, big.ID)
	if err != nil {
		return err
	}
	fmt.Printf("task %d (train, needs gpu=2) is still %s: %s\n", big.ID, waiting.Status, waiting.WaitReason)
	res, err := fleet.Client.Stop(ctx, big.ID, flotilla.Reason("no node has 2 gpus"), flotilla.By("example"))
	if err != nil {
		return err
	}
	fmt.Printf("stopped task %d: %s -> %s\n", big.ID, res.From, res.Status)
	return nil
}

// seq returns lo, lo+1, ..., hi-1.
func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for b := lo; b < hi; b++ {
		out = append(out, b)
	}
	return out
}

// keysIn returns the first n keys prefix-1, prefix-2, ... whose buckets
// are in set: keys hash to buckets, so a key is chosen for the node that
// should run its task.
func keysIn(p bucket.Policy, set bucket.Set, prefix string, n int) []string {
	var keys []string
	for i := 1; len(keys) < n; i++ {
		if k := fmt.Sprintf("%s-%d", prefix, i); set.Contains(p.Of(k)) {
			keys = append(keys, k)
		}
	}
	return keys
}

// waitReason reads queued task id until it carries a wait reason naming
// resources, for at most a few seconds.
func waitReason(ctx context.Context, c *flotilla.Client, id int64) (*task.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return tempfleet.Poll(ctx, c, id, func(t *task.Task) (bool, error) {
		if t.Status != task.Queued {
			return false, fmt.Errorf("task %d is %s, not queued", id, t.Status)
		}
		return strings.HasPrefix(t.WaitReason, "resources:"), nil
	})
}
