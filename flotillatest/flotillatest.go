// Package flotillatest tests code that uses flotilla, in the spirit of
// net/http/httptest: run a handler against a task without a fleet (Work),
// check what a function submitted (RequireSubmitted), and run a one-node
// fleet on a temporary SQLite file that the test's end tears down
// (NewFleet).
//
//	func TestSendEmail(t *testing.T) {
//		id, err := flotillatest.Work(t, sendEmail, Email{To: "ada@example.com"})
//		if err != nil || id == "" {
//			t.Fatalf("sendEmail: %q, %v", id, err)
//		}
//	}
//
//	func TestSignupQueuesAWelcomeEmail(t *testing.T) {
//		fleet := flotillatest.NewFleet(t, func(n *node.Node) error { return flotilla.Handle(n, sendEmail) })
//		signup(ctx, fleet.Client, "ada@example.com")
//		got := flotillatest.RequireSubmitted[Email](t, fleet.Client, flotillatest.WithKey("ada@example.com"))
//		fleet.Wait(got.Task.ID) // the fleet runs it
//	}
//
// Work runs the handler as a node would: the arguments go through JSON and
// are decoded strictly, the result through JSON too, and a panic is a
// failed attempt. What a node would give the attempt (saved progress, the
// results of its pipeline dependencies, a pause request) is given by
// options, and what the handler did with it is recorded (WithRecorder).
package flotillatest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// WorkOption sets what Work gives the attempt.
type WorkOption func(*attempt)

// attempt is what Work gives the handler, and records what it did.
type attempt struct {
	task       task.Task
	pause      bool
	deps       map[string]json.RawMessage
	middleware []node.Middleware
	record     *Recorded
	err        error // an option that could not be applied
}

// Recorded is what a handler run by Work did with its attempt, besides what
// it returned.
type Recorded struct {
	// Task is the task as the handler left it: its Result, its Progress.
	Task *task.Task
	// Progress is every progress the handler saved, in order.
	Progress []json.RawMessage
	// Appended is every step the handler appended to its pipeline.
	Appended []task.Step
}

// WithRecorder has Work record in r what the handler did.
func WithRecorder(r *Recorded) WorkOption { return func(a *attempt) { a.record = r } }

// WithKey sets the task's key (default "").
func WithKey(key string) WorkOption { return func(a *attempt) { a.task.Key = key } }

// WithAttempt runs attempt number n of max (default 1 of
// store.DefaultMaxAttempts).
func WithAttempt(n, max int) WorkOption {
	return func(a *attempt) { a.task.Attempt, a.task.MaxAttempts = n, max }
}

// WithProgress gives the attempt the progress an earlier attempt saved,
// as JSON of v.
func WithProgress(v any) WorkOption {
	return func(a *attempt) {
		b, err := json.Marshal(v)
		if err != nil {
			a.err = fmt.Errorf("WithProgress: %T does not encode to JSON: %w", v, err)
		}
		a.task.Progress = b
	}
}

// WithPauseRequested runs the attempt as if a pause had been requested:
// its Checkpoint returns task.ErrPaused.
func WithPauseRequested() WorkOption { return func(a *attempt) { a.pause = true } }

// WithDependencyResults runs the attempt as a pipeline step (named step)
// whose dependencies ended with the results given, by step name, each
// encoded as JSON (nil for a dependency that recorded none).
func WithDependencyResults(step string, results map[string]any) WorkOption {
	return func(a *attempt) {
		a.task.Pipeline, a.task.Step = 1, step
		a.deps = make(map[string]json.RawMessage, len(results))
		for name, r := range results {
			if r == nil {
				a.deps[name] = nil
				continue
			}
			b, err := json.Marshal(r)
			if err != nil {
				a.err = fmt.Errorf("WithDependencyResults: the result of %s, %T, does not encode to JSON: %w", name, r, err)
			}
			a.deps[name] = b
		}
	}
}

// WithMetadata gives the task metadata, as flotilla.WithMetadata does.
func WithMetadata(md map[string]string) WorkOption {
	return func(a *attempt) { a.task.Metadata = maps.Clone(md) }
}

// WithMiddleware runs the handler inside mws, as node.Config.Middleware
// would.
func WithMiddleware(mws ...node.Middleware) WorkOption {
	return func(a *attempt) { a.middleware = append(a.middleware, mws...) }
}

// Work runs fn against one attempt of a task of args, as a node would, and
// returns what the attempt came to: fn's result after a round trip through
// JSON, or its error (a payload that does not decode is one, wrapped in
// task.NoRetry). A panic is an error too (*node.PanicError). The task is
// task 1, attempt 1 of store.DefaultMaxAttempts, unless opts say otherwise.
func Work[T flotilla.Args, R any](t testing.TB, fn func(ctx context.Context, job *flotilla.Job[T]) (R, error),
	args T, opts ...WorkOption) (R, error) {
	t.Helper()
	var zero R
	payload, err := json.Marshal(args)
	if err != nil {
		t.Fatalf("flotillatest.Work: the arguments %T do not encode to JSON: %v", args, err)
	}
	a := &attempt{task: task.Task{
		ID: 1, Kind: args.Kind(), Status: task.Running, Attempt: 1, MaxAttempts: store.DefaultMaxAttempts,
		Payload: payload, ClaimSeq: 1, Epoch: 1,
	}}
	for _, opt := range opts {
		opt(a)
	}
	if a.err != nil {
		t.Fatalf("flotillatest.Work: %v", a.err)
	}
	tk := a.task
	tk.BindAttempt(a)
	if a.record != nil {
		*a.record = Recorded{Task: &tk}
	}
	h := node.Recover(node.Chain(flotilla.NewHandler(fn), a.middleware...))
	if err := h(t.Context(), &tk); err != nil {
		return zero, err
	}
	tk.Status = task.Succeeded
	if len(tk.Result) > task.MaxResultBytes {
		return zero, fmt.Errorf("the result is %d bytes, over task.MaxResultBytes (%d): a node fails such an attempt",
			len(tk.Result), task.MaxResultBytes)
	}
	return flotilla.ResultOf[R](&tk)
}

// Checkpoint implements task.AttemptHooks.
func (a *attempt) Checkpoint(context.Context) error {
	if a.pause {
		return task.ErrPaused
	}
	return nil
}

// SaveProgress implements task.AttemptHooks: it records the progress.
func (a *attempt) SaveProgress(_ context.Context, progress json.RawMessage) error {
	if !json.Valid(progress) {
		return fmt.Errorf("%w: progress %q is not JSON", store.ErrInvalid, progress)
	}
	if a.record != nil {
		a.record.Progress = append(a.record.Progress, append(json.RawMessage(nil), progress...))
	}
	return nil
}

// DependencyResults implements task.PipelineHooks.
func (a *attempt) DependencyResults(context.Context) (map[string]json.RawMessage, error) {
	if a.deps == nil {
		return nil, errors.New("flotillatest: the step's dependency results were not given: use WithDependencyResults")
	}
	return maps.Clone(a.deps), nil
}

// Append implements task.PipelineHooks: it records the steps.
func (a *attempt) Append(steps []task.Step) error {
	if a.record != nil {
		a.record.Appended = append(a.record.Appended, steps...)
	}
	return nil
}
