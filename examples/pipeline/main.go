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
	"encoding/json"
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

// part is the payload of a count step: which third of the document to count.
type part struct {
	Index int `json:"index"`
	Of    int `json:"of"`
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
	n.Register("fetch", func(ctx context.Context, t *task.Task) error {
		out, err := json.Marshal(map[string]string{"text": document})
		if err != nil {
			return err
		}
		t.Result = out
		fmt.Printf("step %s: fetched %d words\n", t.Step, len(strings.Fields(document)))
		return nil
	})
	n.Register("count", func(ctx context.Context, t *task.Task) error {
		var p part
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return task.NoRetry(err)
		}
		deps, err := t.DependencyResults(ctx)
		if err != nil {
			return err
		}
		var doc struct{ Text string }
		if err := json.Unmarshal(deps["fetch"], &doc); err != nil {
			return task.NoRetry(fmt.Errorf("result of fetch %s: %w", deps["fetch"], err))
		}
		words := strings.Fields(doc.Text)
		size := (len(words) + p.Of - 1) / p.Of
		lo, hi := min(p.Index*size, len(words)), min((p.Index+1)*size, len(words))
		t.Result = json.RawMessage(fmt.Sprintf(`{"words":%d}`, hi-lo))
		fmt.Printf("step %s: counted %d words\n", t.Step, hi-lo)
		return nil
	})
	n.Register("sum", func(ctx context.Context, t *task.Task) error {
		deps, err := t.DependencyResults(ctx)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(deps))
		for name := range deps {
			names = append(names, name)
		}
		sort.Strings(names)
		total := 0
		for _, name := range names {
			var c struct{ Words int }
			if err := json.Unmarshal(deps[name], &c); err != nil {
				return task.NoRetry(fmt.Errorf("result of %s %s: %w", name, deps[name], err))
			}
			total += c.Words
		}
		t.Result = json.RawMessage(fmt.Sprintf(`{"words":%d}`, total))
		fmt.Printf("step %s: read the results of %s: %d words in all\n", t.Step, strings.Join(names, ", "), total)
		return nil
	})
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	const parts = 3
	steps := []task.Step{{Name: "fetch", Kind: "fetch"}}
	var fanIn []task.Dependency
	for i := range parts {
		name := fmt.Sprintf("count-%d", i+1)
		payload, err := json.Marshal(part{Index: i, Of: parts})
		if err != nil {
			return err
		}
		steps = append(steps, task.Step{
			Name: name, Kind: "count", Payload: payload,
			DependsOn: []task.Dependency{{Step: "fetch"}},
		})
		fanIn = append(fanIn, task.Dependency{Step: name})
	}
	steps = append(steps, task.Step{Name: "sum", Kind: "sum", DependsOn: fanIn})

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
