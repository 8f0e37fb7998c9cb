package task

import (
	"context"
	"encoding/json"
	"errors"
)

// ErrPaused is what Checkpoint returns when a pause was requested, and what
// a handler returns to say that it saved its progress and stopped for the
// pause: the task becomes paused, and a resume queues it again, its next
// attempt seeing the saved progress.
var ErrPaused = errors.New("task paused at a checkpoint")

// ErrNoAttempt is returned by SaveProgress on a task that no node is
// running, such as a copy read from a store.
var ErrNoAttempt = errors.New("the task is not a running attempt: there is nowhere to save progress")

// AttemptHooks connect a running attempt's handler to the node that runs
// it. The node binds them when it launches the attempt, so that package task
// needs no store and no I/O of its own.
type AttemptHooks interface {
	// Checkpoint returns ErrPaused once a pause was requested for the
	// attempt, and nil otherwise.
	Checkpoint(ctx context.Context) error
	// SaveProgress records progress for the attempt, fenced like every
	// write about it.
	SaveProgress(ctx context.Context, progress json.RawMessage) error
}

// BindAttempt attaches the hooks of the attempt this task is the handler's
// view of. Nodes call it; handlers have no reason to.
func (t *Task) BindAttempt(h AttemptHooks) { t.hooks = h }

// Checkpoint is where a cooperative handler can be paused: it returns
// ErrPaused when a pause was requested. The handler should then save its
// progress (SaveProgress) and return ErrPaused. Without a running attempt
// behind the task (in tests) it returns nil: nothing can ask for a pause.
func (t *Task) Checkpoint(ctx context.Context) error {
	if t.hooks == nil {
		return nil
	}
	return t.hooks.Checkpoint(ctx)
}

// SaveProgress records progress (JSON) for the attempt; the next attempt
// reads it as Progress. A write from an attempt that was superseded is
// refused (the error matches store.ErrFenced). Without a running attempt it
// returns ErrNoAttempt.
func (t *Task) SaveProgress(ctx context.Context, progress json.RawMessage) error {
	if t.hooks == nil {
		return ErrNoAttempt
	}
	if err := t.hooks.SaveProgress(ctx, progress); err != nil {
		return err
	}
	t.Progress = append(json.RawMessage(nil), progress...)
	return nil
}

// ErrNoRetry marks a handler's error as one that another attempt cannot
// fix (bad input, a command this node refuses to run): the task fails at
// once instead of using up its attempts. Wrap it with NoRetry.
var ErrNoRetry = errors.New("not worth retrying")

// NoRetry wraps err so that the node fails the task without retrying it.
func NoRetry(err error) error { return &noRetry{err} }

type noRetry struct{ err error }

func (e *noRetry) Error() string { return e.err.Error() }

func (e *noRetry) Unwrap() []error { return []error{e.err, ErrNoRetry} }
