// Pipeline submits a pipeline with a fan-out and a fan-in: one step fetches
// a document, three steps each count the words of one part of it, in
// parallel, and a last step adds their counts, read from its dependencies'
// results (t.DependencyResults).
//
// The whole pipeline is created atomically, in one bucket (its Key's), and
// the holder of that bucket releases each step in the transaction that
// ends its last dependency.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/pipeline
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const document = "the quick brown fox jumps over the lazy dog and then the dog sleeps in the sun all afternoon"

// Fetch is the payload of the step that fetches the document.
type Fetch struct{}

func (Fetch) Kind() string { return "fetch" }

// Doc is what Fetch returns.
type Doc struct {
	Text string `json:"text"`
}

// Count is the payload of a count step: which third of the document to count.
type Count struct {
	Index int `json:"index"`
	Of    int `json:"of"`
}

func (Count) Kind() string { return "count" }

// Words is what a count step, and the sum, return.
type Words struct {
	Words int `json:"words"`
}

// Sum is the payload of the step that adds the counts up.
type Sum struct{}

func (Sum) Kind() string { return "sum" }

func fetch(ctx context.Context, job *flotilla.Job[Fetch]) (Doc, error) {
	fmt.Printf("step %s: fetched %d words\n", job.Task().Step, len(strings.Fields(document)))
	return Doc{Text: document}, nil
}

func count(ctx context.Context, job *flotilla.Job[Count]) (Words, error) {
	var doc Doc
	if err := job.DependencyResult(ctx, "fetch", &doc); err != nil {
		return Words{}, err
	}
	words := strings.Fields(doc.Text)
	size := (len(words) + job.Args.Of - 1) / job.Args.Of
	lo, hi := min(job.Args.Index*size, len(words)), min((job.Args.Index+1)*size, len(words))
	fmt.Printf("step %s: counted %d words\n", job.Task().Step, hi-lo)
	return Words{Words: hi - lo}, nil
}

// sum reads the results of all its dependencies: a fan-in.
func sum(ctx context.Context, job *flotilla.Job[Sum]) (Words, error) {
	deps, err := job.DependencyResults(ctx)
	if err != nil {
		return Words{}, err
	}
	names := make([]string, 0, len(deps))
	for name := range deps {
		names = append(names, name)
	}
	sort.Strings(names)
	total := 0
	for _, name := range names {
		var c Words
		if err := job.DependencyResult(ctx, name, &c); err != nil {
			return Words{}, task.NoRetry(err)
		}
		total += c.Words
	}
	fmt.Printf("step %s: read the results of %s: %d words in all\n", job.Task().Step, strings.Join(names, ", "), total)
	return Words{Words: total}, nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
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
	for _, err := range []error{flotilla.Handle(n, fetch), flotilla.Handle(n, count), flotilla.Handle(n, sum)} {
		if err != nil {
			return err
		}
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	const parts = 3
	first, err := flotilla.NewStep("fetch", Fetch{})
	if err != nil {
		return err
	}
	steps := []task.Step{first}
	var fanIn []string
	for i := range parts {
		name := fmt.Sprintf("count-%d", i+1)
		st, err := flotilla.NewStep(name, Count{Index: i, Of: parts}, "fetch")
		if err != nil {
			return err
		}
		steps = append(steps, st)
		fanIn = append(fanIn, name)
	}
	last, err := flotilla.NewStep("sum", Sum{}, fanIn...)
	if err != nil {
		return err
	}
	steps = append(steps, last)

	p, err := fleet.Client.SubmitPipeline(ctx, flotilla.PipelineRequest{Name: "word-count", Key: "doc-1", Steps: steps})
	if err != nil {
		return err
	}
	fmt.Printf("submitted pipeline %d (%s) with %d steps in bucket %d\n", p.ID, p.Name, len(p.Steps), p.Bucket)

	p, err = waitPipeline(ctx, fleet.Client, p.ID)
	if err != nil {
		return err
	}
	fmt.Printf("pipeline %d %s:\n", p.ID, p.Status())
	for _, s := range p.Steps {
		fmt.Printf("  %-8s %-9s result %s\n", s.Name, s.Task.Status, s.Task.Result)
	}
	return n.Shutdown(ctx)
}

// waitPipeline reads pipeline id until every step has ended.
func waitPipeline(ctx context.Context, c *flotilla.Client, id int64) (store.Pipeline, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		p, err := c.GetPipeline(ctx, id)
		if err != nil {
			return p, err
		}
		if p.Status() != store.PipelineRunning {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("pipeline %d still running: %w", id, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
