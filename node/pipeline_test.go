package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A step reads its dependencies' results by name, and appends a step that
// runs after it; a result over the cap fails its attempt.
func TestAStepReadsItsDependenciesResultsAndAppends(t *testing.T) {
	b := setup(t)
	var (
		mu   sync.Mutex
		seen = map[string]string{}
	)
	b.startNode(t, b.config(t, "solo"), map[string]Handler{
		"produce": func(_ context.Context, tk *task.Task) error {
			tk.Result = json.RawMessage(`{"from":"` + tk.Step + `"}`)
			return nil
		},
		"join": func(ctx context.Context, tk *task.Task) error {
			got, err := tk.DependencyResults(ctx)
			if err != nil {
				return err
			}
			again, err := tk.DependencyResults(ctx)
			if err != nil || len(again) != len(got) {
				return errors.New("a second read differs from the first")
			}
			mu.Lock()
			for k, v := range got {
				seen[k] = string(v)
			}
			mu.Unlock()
			if err := tk.Append(task.Step{Name: "report", Kind: "produce"}); err != nil {
				return err
			}
			// A step may not depend on anything but its appender and its
			// siblings: refused at once.
			if err := tk.Append(task.Step{Name: "bad", Kind: "produce", DependsOn: []task.Dependency{{Step: "a"}}}); err == nil {
				return errors.New("an append depending on another step was accepted")
			}
			// Nor may it carry what a submitted task may not.
			var invalid *store.InvalidError
			if err := tk.Append(task.Step{Name: "many", Kind: "produce", MaxAttempts: store.MaxMaxAttempts + 1}); !errors.As(err, &invalid) {
				return fmt.Errorf("an append of a step with max attempts over the bound: %v, want a *store.InvalidError", err)
			}
			return nil
		},
		"huge": func(_ context.Context, tk *task.Task) error {
			tk.Result = json.RawMessage(`"` + strings.Repeat("x", task.MaxResultBytes) + `"`)
			return nil
		},
	})
	p, err := b.store.CreatePipeline(b.ctx, store.NewPipeline{Name: "n", Steps: []task.Step{
		{Name: "a", Kind: "produce"}, {Name: "b", Kind: "produce"},
		{Name: "join", Kind: "join", DependsOn: []task.Dependency{{Step: "a"}, {Step: "b"}}},
		{Name: "huge", Kind: "huge", MaxAttempts: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pipeline ended", func() bool {
		got, err := b.store.GetPipeline(b.ctx, p.ID)
		return err == nil && got.Status() != store.PipelineRunning && len(got.Steps) == 5
	})
	got, _ := b.store.GetPipeline(b.ctx, p.ID)
	for _, s := range got.Steps {
		want := task.Succeeded
		if s.Name == "huge" {
			want = task.Failed
		}
		if s.Task.Status != want {
			t.Errorf("step %s is %s, want %s (%s)", s.Name, s.Task.Status, want, s.Task.Error)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["a"] != `{"from":"a"}` || seen["b"] != `{"from":"b"}` || len(seen) != 2 {
		t.Errorf("join read %v", seen)
	}
	if s, _ := got.Step("huge"); !strings.Contains(s.Task.Error, "MaxResultBytes") {
		t.Errorf("an oversized result failed with %q", s.Task.Error)
	}
}

// Outside a pipeline, a task has no dependencies to read and nothing to
// append to.
func TestATaskOutsideAPipelineHasNoDependencies(t *testing.T) {
	var tk task.Task
	if _, err := tk.DependencyResults(context.Background()); !errors.Is(err, task.ErrNotInPipeline) {
		t.Errorf("DependencyResults: %v", err)
	}
	if err := tk.Append(task.Step{Name: "x", Kind: "k"}); !errors.Is(err, task.ErrNotInPipeline) {
		t.Errorf("Append: %v", err)
	}
}
