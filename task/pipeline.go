package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Dependency policies: which ends of a dependency let the step that depends
// on it run. A step whose dependency ends otherwise is skipped, and so are
// its descendants. A skipped dependency is accepted by none of them: a step
// that never ran produced nothing for anyone.
const (
	// OnSuccess (the default) runs the step once the dependency succeeded.
	OnSuccess = "success"
	// OnAny runs the step however the dependency ended, skipped aside.
	OnAny = "any"
	// OnFailure runs the step only when the dependency ended without
	// success (failed, timed out, stopped, cancelled, lost): a clean-up.
	OnFailure = "failure"
)

// Dependency is one edge of a pipeline: the step depended on, by name, and
// the policy that decides whether its end lets the dependent run.
type Dependency struct {
	Step string `json:"step"`
	On   string `json:"on,omitempty"` // OnSuccess when empty
}

// Policy is the dependency's policy, OnSuccess when none was given.
func (d Dependency) Policy() string {
	if d.On == "" {
		return OnSuccess
	}
	return d.On
}

// CheckPolicy refuses a policy that is none of OnSuccess, OnAny, OnFailure.
func CheckPolicy(on string) error {
	switch on {
	case "", OnSuccess, OnAny, OnFailure:
		return nil
	}
	return fmt.Errorf("dependency policy %q: want %q (the default), %q or %q", on, OnSuccess, OnAny, OnFailure)
}

// Accepts reports whether a dependency that ended in status lets a step
// with policy on run. It is false for a status that is not terminal.
func Accepts(on string, status Status) bool {
	if !status.Terminal() || status == Skipped {
		return false
	}
	switch on {
	case OnAny:
		return true
	case OnFailure:
		return status != Succeeded
	default:
		return status == Succeeded
	}
}

// Step is one task of a pipeline, as submitted or appended: a name unique in
// its pipeline, what to run, and what it waits for.
type Step struct {
	Name        string          `json:"name"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	Priority    int             `json:"priority,omitempty"`
	MaxAttempts int             `json:"max_attempts,omitempty"`
	Timeout     time.Duration   `json:"timeout,omitempty"`
	DependsOn   []Dependency    `json:"depends_on,omitempty"`
}

// MaxResultBytes caps a handler's result: a dependent step reads its
// dependencies' results whole, and a result is a summary to pass on, not
// bulk data (put that in object storage and pass its address). A larger
// result fails the attempt.
const MaxResultBytes = 256 << 10

// ErrNotInPipeline is returned by DependencyResults and Append on a task
// that is not a pipeline step.
var ErrNotInPipeline = errors.New("the task is not a step of a pipeline")

// PipelineHooks are the attempt hooks of a pipeline step. The node's hooks
// implement them; a task without them has no dependencies to read and no
// pipeline to append to.
type PipelineHooks interface {
	// DependencyResults reads the results of the step's dependencies.
	DependencyResults(ctx context.Context) (map[string]json.RawMessage, error)
	// Append records steps to add to the pipeline with the attempt's
	// outcome.
	Append(steps []Step) error
}

// DependencyResults returns the results of the task's dependencies, by step
// name (a dependency that set none maps to nil). They are read from the
// store on the first call and kept for the rest of the attempt: results do
// not change once their step has ended, and a step runs only after its
// dependencies have. Loading them lazily keeps the claim, which every task
// pays for, free of work that only steps reading results need.
//
// Results that take more than 64 MiB in all (store.MaxDependencyResultsBytes)
// are refused with an error that matches store.ErrDependencyResultsTooLarge,
// before any is read: a fan-in over thousands of steps should pass
// references to its data (object keys, URLs), not the data.
func (t *Task) DependencyResults(ctx context.Context) (map[string]json.RawMessage, error) {
	if t.Pipeline == 0 {
		return nil, ErrNotInPipeline
	}
	h, ok := t.hooks.(PipelineHooks)
	if !ok {
		return nil, ErrNoAttempt
	}
	return h.DependencyResults(ctx)
}

// Append adds steps to the task's pipeline, each depending on this task
// (on success, unless it names this task's step with another policy) and
// possibly on the other steps appended with it. They are written with the
// attempt's outcome, in the same transaction and fenced like it, when the
// task ends; an attempt that is retried, released or paused drops them, and
// the next attempt appends again. Names must be new to the pipeline; the
// check that they are is made when the outcome is written, and a name
// already taken fails the step.
func (t *Task) Append(steps ...Step) error {
	if t.Pipeline == 0 {
		return ErrNotInPipeline
	}
	h, ok := t.hooks.(PipelineHooks)
	if !ok {
		return ErrNoAttempt
	}
	return h.Append(steps)
}
