package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func TestRetryPlanRefusesAPipelineMissingADependency(t *testing.T) {
	// transform and load are left of a chain whose extract has no task:
	// a retry of transform would wait for extract forever.
	failed := &task.Task{Status: task.Failed}
	skipped := &task.Task{Status: task.Skipped}
	p := store.Pipeline{ID: 7, Steps: []store.PipelineStep{
		{Name: "transform", DependsOn: []task.Dependency{{Step: "extract"}}, Task: failed, Tries: 1},
		{Name: "load", DependsOn: []task.Dependency{{Step: "transform"}}, Task: skipped, Tries: 1},
	}}
	_, err := store.RetryPlan(p, "transform")
	var partial *store.PartialPipelineError
	if !errors.As(err, &partial) || !errors.Is(err, store.ErrPartialPipeline) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RetryPlan of a partial pipeline: %v, want a *store.PartialPipelineError matching ErrPartialPipeline and ErrNotFound", err)
	}
	if partial.Pipeline != 7 || partial.Step != "transform" || partial.Missing != "extract" {
		t.Errorf("the error names %+v, want pipeline 7, step transform, missing extract", *partial)
	}
	if msg := err.Error(); !strings.Contains(msg, "pipeline 7") || !strings.Contains(msg, `"extract"`) {
		t.Errorf("the error %q does not name the pipeline and the missing step", msg)
	}
	p.Steps = append([]store.PipelineStep{{Name: "extract", Task: &task.Task{Status: task.Succeeded}, Tries: 1}}, p.Steps...)
	if names, err := store.RetryPlan(p, "transform"); err != nil || strings.Join(names, " ") != "transform load" {
		t.Errorf("RetryPlan of the whole pipeline: %v, %v; want transform and load", names, err)
	}
}
