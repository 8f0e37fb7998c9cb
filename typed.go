package flotilla

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Args is a task's payload as a Go type: a struct encoded as JSON, whose
// Kind names the handler that runs it. Kind must not depend on the value:
// Handle calls it on the zero value.
type Args interface {
	Kind() string
}

// Job is one attempt of a task of type T, as its handler sees it. The
// fields are the task's; what the handler may do with the attempt (save
// progress, read its pipeline dependencies' results, fence its side
// effects) is done through the methods.
type Job[T Args] struct {
	ID          int64  // the task's id: the same for every attempt, an idempotency key
	Key         string // the task's key ("" when it has none)
	Attempt     int    // this attempt's number, from 1
	MaxAttempts int    // the attempts the task has
	Args        T      // the payload, decoded

	t *task.Task
}

// Kind is the kind of the task: T's Kind.
func (j *Job[T]) Kind() string { return j.t.Kind }

// FencingToken is this attempt's fencing token: it grows with every attempt
// of the task and never goes back. A handler whose side effect must not be
// overwritten by an attempt that was superseded (a node frozen while its
// bucket was taken over) stores it with the effect and refuses a write that
// carries a smaller one. docs/handlers.md shows such a write.
func (j *Job[T]) FencingToken() int64 { return j.t.ClaimSeq }

// Checkpoint is where the handler can be paused: it returns task.ErrPaused
// once a pause was requested, and the handler should then save its
// progress and return task.ErrPaused. Without a pause it returns nil.
func (j *Job[T]) Checkpoint(ctx context.Context) error { return j.t.Checkpoint(ctx) }

// SaveProgress records progress (any value that encodes to JSON) for this
// attempt; the next attempt of the task, after a pause, a retry or a
// rescue, reads it with Progress. It is fenced like every write about the
// attempt: from a superseded attempt it fails, matching store.ErrFenced.
func (j *Job[T]) SaveProgress(ctx context.Context, progress any) error {
	b, err := json.Marshal(progress)
	if err != nil {
		return fmt.Errorf("progress of task %d: %T does not encode to JSON: %w", j.ID, progress, err)
	}
	return j.t.SaveProgress(ctx, b)
}

// Progress decodes the progress an earlier attempt saved into v, a
// pointer, and reports whether there was any.
func (j *Job[T]) Progress(v any) (bool, error) {
	if len(j.t.Progress) == 0 || bytes.Equal(j.t.Progress, []byte("null")) {
		return false, nil
	}
	if err := json.Unmarshal(j.t.Progress, v); err != nil {
		return false, fmt.Errorf("progress of task %d does not decode into %T: %w", j.ID, v, err)
	}
	return true, nil
}

// DependencyResult decodes into v, a pointer, the result of step, one of
// this pipeline step's dependencies. A dependency that recorded no result
// leaves v as it is. A step that is not a dependency is an error naming
// the dependencies; so is a task that is no pipeline step
// (task.ErrNotInPipeline).
func (j *Job[T]) DependencyResult(ctx context.Context, step string, v any) error {
	results, err := j.t.DependencyResults(ctx)
	if err != nil {
		return err
	}
	r, ok := results[step]
	if !ok {
		names := make([]string, 0, len(results))
		for name := range results {
			names = append(names, name)
		}
		return fmt.Errorf("step %q is not a dependency of step %q (its dependencies: %v)", step, j.t.Step, names)
	}
	if len(r) == 0 {
		return nil
	}
	if err := json.Unmarshal(r, v); err != nil {
		return fmt.Errorf("the result of step %s does not decode into %T: %w", step, v, err)
	}
	return nil
}

// DependencyResults returns the results of this pipeline step's
// dependencies by step name, as JSON (nil for one that recorded none): a
// fan-in reads them all, up to 64 MiB in all (task.Task.DependencyResults
// says what happens beyond).
func (j *Job[T]) DependencyResults(ctx context.Context) (map[string]json.RawMessage, error) {
	return j.t.DependencyResults(ctx)
}

// Append adds steps to this task's pipeline, written with the attempt's
// outcome when the task ends (see task.Task.Append).
func (j *Job[T]) Append(steps ...task.Step) error { return j.t.Append(steps...) }

// Metadata returns the task's metadata (WithMetadata): what travels with
// it apart from its payload. The map is the handler's own.
func (j *Job[T]) Metadata() map[string]string { return j.t.Metadata }

// Task is the task under the job, for what the job does not show (its
// schedule, its pipeline step's name, its bucket and epoch).
func (j *Job[T]) Task() *task.Task { return j.t }

// kindOf is T's kind, checked as a store checks a task's.
func kindOf[T Args]() (string, error) {
	typ := reflect.TypeFor[T]()
	if typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Interface {
		return "", fmt.Errorf("%w: task type %v is a %s: give the type itself (a struct), whose Kind works on its zero value",
			store.ErrInvalid, typ, typ.Kind())
	}
	var zero T
	kind := zero.Kind()
	if err := store.CheckName("kind", kind, true); err != nil {
		return "", fmt.Errorf("the Kind of %v: %w", typ, err)
	}
	return kind, nil
}

// Handle makes n run tasks of T's kind with fn, before n starts: the
// payload is decoded into T, and what fn returns is the attempt's outcome,
// its R stored as the task's result (JSON; read it with ResultOf). A
// handler with nothing to return uses struct{} for R, and no result is
// stored.
//
// The payload is decoded strictly: a field that T does not have, or a
// value of the wrong type, fails the task at once, without retries, with
// an error naming the field. An error fn returns is retried while attempts
// remain, unless wrapped in task.NoRetry. Handle refuses a T that is a
// pointer, a kind a store would refuse, a kind registered twice, and a
// node that has started.
func Handle[T Args, R any](n *node.Node, fn func(ctx context.Context, job *Job[T]) (R, error)) error {
	kind, err := kindOf[T]()
	if err != nil {
		return err
	}
	return n.RegisterSafely(kind, NewHandler(fn))
}

// NewHandler is the node.Handler that Handle registers: fn, given its
// payload decoded strictly into T, its result stored as JSON. Register it
// under T's kind yourself where Handle does not fit, such as behind a
// middleware of one kind only.
func NewHandler[T Args, R any](fn func(ctx context.Context, job *Job[T]) (R, error)) node.Handler {
	return func(ctx context.Context, t *task.Task) error {
		job := &Job[T]{ID: t.ID, Key: t.Key, Attempt: t.Attempt, MaxAttempts: t.MaxAttempts, t: t}
		if err := decodeStrict(t.Payload, &job.Args); err != nil {
			// Another attempt would decode the same payload the same way.
			return task.NoRetry(fmt.Errorf("%s task %d: the payload does not decode into %T: %w", t.Kind, t.ID, job.Args, err))
		}
		r, err := fn(ctx, job)
		if err != nil {
			return err
		}
		if _, none := any(r).(struct{}); none {
			return nil
		}
		out, err := json.Marshal(r)
		if err != nil {
			return task.NoRetry(fmt.Errorf("%s task %d: the result %T does not encode to JSON: %w", t.Kind, t.ID, r, err))
		}
		t.Result = out
		return nil
	}
}

// decodeStrict decodes a payload into v, refusing fields v does not have.
// No payload reads as JSON null, which leaves v as it is.
func decodeStrict(payload json.RawMessage, v any) error {
	if len(payload) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// ErrNoResult is matched by ResultOf's error on a task that has not
// succeeded: it has no result to read.
var ErrNoResult = errors.New("the task has not succeeded, so it has no result")

// ResultOf decodes the result of task t, which its handler returned, as an
// R. A task that has not succeeded is an error matching ErrNoResult, naming
// its state and its error; a task that succeeded without a result gives
// R's zero value.
func ResultOf[R any](t *task.Task) (R, error) {
	var r R
	if t.Status != task.Succeeded {
		why := ""
		if t.Error != "" {
			why = fmt.Sprintf(" (error: %s)", t.Error)
		}
		return r, fmt.Errorf("task %d is %s%s: %w", t.ID, t.Status, why, ErrNoResult)
	}
	if len(t.Result) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(t.Result, &r); err != nil {
		return r, fmt.Errorf("the result of task %d does not decode into %T: %w", t.ID, r, err)
	}
	return r, nil
}

// WaitResult waits for task id to end (Client.Wait) and returns its
// result as ResultOf does: a task that ended without success is an error
// matching ErrNoResult.
func WaitResult[R any](ctx context.Context, c *Client, id int64) (R, error) {
	t, err := c.Wait(ctx, id)
	if err != nil {
		var zero R
		return zero, err
	}
	return ResultOf[R](t)
}

// NewRequest is the request SubmitArgs submits: args encoded as the
// payload, under their kind, with opts' fields applied. Give it to
// SubmitMany or SubmitTx to submit several tasks at once.
func NewRequest[T Args](args T, opts ...SubmitOption) (TaskRequest, error) {
	r, err := argsRequest(args)
	if err != nil {
		return TaskRequest{}, err
	}
	o := newSubmitOptions(opts)
	return o.apply(r), nil
}

// argsRequest is args as a request of their kind, before any option.
func argsRequest[T Args](args T) (TaskRequest, error) {
	payload, err := json.Marshal(args)
	if err != nil {
		return TaskRequest{}, fmt.Errorf("%w: the arguments %T do not encode to JSON: %v", store.ErrInvalid, args, err)
	}
	return TaskRequest{Kind: args.Kind(), Payload: payload}, nil
}

// NewStep is a pipeline step of args' kind, args as its payload, that
// depends on the steps named in dependsOn on their success (set a step's
// DependsOn yourself for another policy).
func NewStep[T Args](name string, args T, dependsOn ...string) (task.Step, error) {
	r, err := argsRequest(args)
	if err != nil {
		return task.Step{}, fmt.Errorf("step %q: %w", name, err)
	}
	st := task.Step{Name: name, Kind: r.Kind, Payload: r.Payload}
	for _, d := range dependsOn {
		st.DependsOn = append(st.DependsOn, task.Dependency{Step: d})
	}
	return st, nil
}

// SubmitArgs submits one task of args' kind, args as its payload, with
// opts: the task's fields (WithKey, WithPriority, WithMaxAttempts,
// WithRunAt, WithUniqueKey, ...) and the checks to relax (AllowUnowned,
// AllowUnknownKind). It is Client.Submit with a typed payload, and refuses
// what Submit refuses.
func SubmitArgs[T Args](ctx context.Context, c *Client, args T, opts ...SubmitOption) (*task.Task, error) {
	r, err := argsRequest(args)
	if err != nil {
		return nil, err
	}
	return c.Submit(ctx, r, opts...)
}

// SubmitArgsTx is SubmitArgs inside the caller's PostgreSQL transaction
// (see Client.SubmitTx).
func SubmitArgsTx[T Args](ctx context.Context, c *Client, tx pgx.Tx, args T, opts ...SubmitOption) (*task.Task, error) {
	return submitArgsInTx(ctx, c, tx, "SubmitArgsTx", args, opts)
}

// SubmitArgsSQLiteTx is SubmitArgs inside the caller's SQLite transaction
// (see Client.SubmitSQLiteTx).
func SubmitArgsSQLiteTx[T Args](ctx context.Context, c *Client, tx *sql.Tx, args T, opts ...SubmitOption) (*task.Task, error) {
	return submitArgsInTx(ctx, c, tx, "SubmitArgsSQLiteTx", args, opts)
}

func submitArgsInTx[T Args](ctx context.Context, c *Client, tx any, call string, args T, opts []SubmitOption) (*task.Task, error) {
	r, err := argsRequest(args)
	if err != nil {
		return nil, err
	}
	out, err := c.submitInTx(ctx, tx, call, []TaskRequest{r}, opts)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}
