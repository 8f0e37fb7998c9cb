package flotilla

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// PipelineRequest describes a pipeline to submit: steps with dependencies,
// all placed in the bucket of Key.
type PipelineRequest struct {
	Name string
	// Key routes every step of the pipeline to one bucket, whose holder
	// releases each step in the transaction that ends its last
	// dependency. "" means Name + "-" + the pipeline's id.
	Key   string
	Steps []task.Step
}

// SubmitPipeline creates a pipeline and all its steps atomically, after
// checking, for a pipeline with a key, that a live node holds the key's
// bucket and runs every step's kind (unless told otherwise by opts). A
// pipeline without a key gets its key, and so its bucket, from its id,
// which exists only once it is created: it is not checked. Invalid steps
// (no step, a name twice, a dependency on an unknown step, a cycle) are
// refused with store.ErrInvalid, naming the problem, and nothing is
// written.
//
// Of the submit options it takes the checks (AllowUnowned,
// AllowUnknownKind), and refuses those that set a task's fields: a step's
// are set on its task.Step.
func (c *Client) SubmitPipeline(ctx context.Context, r PipelineRequest, opts ...SubmitOption) (store.Pipeline, error) {
	o := newSubmitOptions(opts)
	if err := o.noFields("SubmitPipeline", "set them on each task.Step, and the key on PipelineRequest.Key"); err != nil {
		return store.Pipeline{}, err
	}
	if _, err := store.CheckNewPipeline(store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps}); err != nil {
		return store.Pipeline{}, err
	}
	if r.Key != "" {
		b := c.policy.Of(r.Key)
		nts := make([]store.NewTask, len(r.Steps))
		for i, s := range r.Steps {
			nts[i] = store.NewTask{Kind: s.Kind, Key: r.Key, Bucket: b}
		}
		if err := c.checkServed(ctx, nts, o); err != nil {
			return store.Pipeline{}, err
		}
	}
	return c.store.CreatePipeline(ctx, store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps})
}

// GetPipeline reads a pipeline with the current task of each step.
func (c *Client) GetPipeline(ctx context.Context, id int64) (store.Pipeline, error) {
	return c.store.GetPipeline(ctx, id)
}

// RetryPipeline runs again the step from and each of its descendants that
// did not succeed, as new tasks; nothing else runs again.
func (c *Client) RetryPipeline(ctx context.Context, id int64, from string) (store.Pipeline, error) {
	return c.store.RetryPipeline(ctx, id, from)
}

// PipelineStepResult is what a request for a whole pipeline did to one of
// its steps.
type PipelineStepResult struct {
	Step string
	commands.Result
}

// StopPipeline stops every unfinished step of a pipeline through the
// existing paths (Client.Stop): a step that waits (pending, queued,
// scheduled, retrying, paused) is cancelled, and its pending dependents are
// skipped; a running one gets a stop command. Finished steps are left as
// they ended. Steps are stopped dependents first, so that a clean-up step
// (on: failure or on: any) is cancelled before any of its dependencies
// ends: a stopped pipeline starts nothing more, clean-up included. It answers one result per step it acted on; a step that ended
// meanwhile is left as it ended. A missing pipeline matches
// store.ErrNotFound.
func (c *Client) StopPipeline(ctx context.Context, id int64, opts ...CommandOption) ([]PipelineStepResult, error) {
	return c.eachUnfinishedStep(ctx, id, store.CommandStop, dependentsFirst, func(s store.PipelineStep) (commands.Result, error) {
		return c.Stop(ctx, s.Task.ID, opts...)
	})
}

// PausePipeline pauses every unfinished step of a pipeline through the
// existing paths (Client.Pause): a step that waits to run (queued,
// scheduled, retrying) is paused at once; a pending one too, and it goes on
// counting its dependencies down (one that ends in a way its policy refuses
// still skips it) but is not released until it is resumed; a running one
// gets a pause command and pauses at its handler's next checkpoint (a
// handler that never checkpoints finishes, and its dependents, paused, wait).
// Steps are visited dependencies first, and the pipeline is read again until
// no new unfinished step appears, so that a step released or appended
// while the pause went on is paused too.
func (c *Client) PausePipeline(ctx context.Context, id int64, opts ...CommandOption) ([]PipelineStepResult, error) {
	return c.eachUnfinishedStep(ctx, id, store.CommandPause, dependenciesFirst, func(s store.PipelineStep) (commands.Result, error) {
		if s.Task.Status == task.Stopping {
			// Being stopped: it ends stopped, which a pause cannot change.
			return commands.Result{TaskID: s.Task.ID, Kind: store.CommandPause, From: s.Task.Status, Status: s.Task.Status}, nil
		}
		return c.Pause(ctx, s.Task.ID, opts...)
	})
}

// ResumePipeline resumes every paused step of a pipeline (Client.Resume): a
// step whose dependencies have all ended is queued (scheduled when it still
// waits for its run_at), one that still waits for some goes back to
// pending, decided by the store on the step's locked row so that a
// dependency ending at the same moment is counted once. Steps that are not
// paused are left alone; one still pausing pauses at its checkpoint after
// this returns and needs another resume.
func (c *Client) ResumePipeline(ctx context.Context, id int64, opts ...CommandOption) ([]PipelineStepResult, error) {
	return c.eachUnfinishedStep(ctx, id, store.CommandResume, dependenciesFirst, func(s store.PipelineStep) (commands.Result, error) {
		if s.Task.Status != task.Paused {
			return commands.Result{}, errNotActedOn
		}
		return c.Resume(ctx, s.Task.ID, opts...)
	})
}

// errNotActedOn is what a step's action answers for a step it leaves alone.
var errNotActedOn = errors.New("step left as it is")

// The orders in which eachUnfinishedStep visits a pipeline's steps.
const (
	dependenciesFirst = false
	dependentsFirst   = true
)

// eachUnfinishedStep applies act to each unfinished step of pipeline id,
// dependencies first (the pipeline's order) or dependents first (its
// reverse), reading the pipeline again until a reading shows no unfinished
// step it has not visited. A step whose request failed because it ended
// meanwhile (or changed to a state the request does not apply to) is left
// out of the results.
func (c *Client) eachUnfinishedStep(ctx context.Context, id int64, kind string, reverse bool,
	act func(store.PipelineStep) (commands.Result, error)) ([]PipelineStepResult, error) {
	visited := map[int64]bool{}
	var out []PipelineStepResult
	for {
		p, err := c.store.GetPipeline(ctx, id)
		if err != nil {
			return out, fmt.Errorf("%s pipeline %d: %w", kind, id, err)
		}
		fresh := false
		steps := dependencyOrder(p.Steps)
		if reverse {
			slices.Reverse(steps)
		}
		for _, s := range steps {
			if s.Task.Status.Terminal() || visited[s.Task.ID] {
				continue
			}
			visited[s.Task.ID], fresh = true, true
			r, err := act(s)
			var tooLate *commands.TooLateError
			var state *commands.StateError
			switch {
			case errors.Is(err, errNotActedOn), errors.As(err, &tooLate), errors.As(err, &state):
				continue // ended, or moved on, since the pipeline was read
			case err != nil:
				return out, fmt.Errorf("%s step %s (task %d) of pipeline %d: %w", kind, s.Name, s.Task.ID, id, err)
			}
			out = append(out, PipelineStepResult{Step: s.Name, Result: r})
		}
		if !fresh {
			return out, nil
		}
	}
}

// dependencyOrder returns the steps with every step after its
// dependencies, otherwise in the order they were added (a pipeline file may
// name a step before the steps it depends on).
func dependencyOrder(steps []store.PipelineStep) []store.PipelineStep {
	byName := make(map[string]int, len(steps))
	for i, s := range steps {
		byName[s.Name] = i
	}
	out := make([]store.PipelineStep, 0, len(steps))
	placed := make([]bool, len(steps))
	// Depth first, without recursion: a chain may be thousands deep.
	type frame struct{ step, next int }
	for root := range steps {
		if placed[root] {
			continue
		}
		placed[root] = true
		stack := []frame{{step: root}}
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			deps := steps[top.step].DependsOn
			if top.next < len(deps) {
				d, ok := byName[deps[top.next].Step]
				top.next++
				if ok && !placed[d] {
					placed[d] = true
					stack = append(stack, frame{step: d})
				}
				continue
			}
			out = append(out, steps[top.step])
			stack = stack[:len(stack)-1]
		}
	}
	return out
}
