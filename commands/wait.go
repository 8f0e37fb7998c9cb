package commands

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// DefaultWaitPoll is how often Wait reads the command when the caller names
// no interval.
const DefaultWaitPoll = 100 * time.Millisecond

// Wait waits until command id has been acknowledged, and returns it with
// the task's state then. An outcome that says the task had already
// finished, and a task that finished without acknowledging the command (it
// ended before its holder applied it), are *TooLateError. Wait polls every
// poll (DefaultWaitPoll when zero) until ctx ends.
func Wait(ctx context.Context, s store.Store, id int64, poll time.Duration) (store.Command, task.Status, error) {
	if poll <= 0 {
		poll = DefaultWaitPoll
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return store.Command{}, "", fmt.Errorf("waiting for command %d: %w", id, context.Cause(ctx))
		case <-timer.C:
		}
		cmd, status, err := check(ctx, s, id)
		if err != nil || cmd.Acked() || status.Terminal() {
			return cmd, status, err
		}
		timer.Reset(poll)
	}
}

// check reads the command and its task once. The task is read first: a
// move that acknowledges a command commits the acknowledgement with the
// state, so a task found finished whose command, read after it, is still
// unacknowledged finished without applying it.
func check(ctx context.Context, s store.Store, id int64) (store.Command, task.Status, error) {
	cmd, err := s.GetCommand(ctx, id)
	if err != nil {
		return store.Command{}, "", fmt.Errorf("waiting for command %d: %w", id, err)
	}
	t, err := s.GetTask(ctx, cmd.TaskID)
	if err != nil {
		return cmd, "", fmt.Errorf("waiting for command %d: %w", id, err)
	}
	if t.Status.Terminal() && !cmd.Acked() {
		if cmd, err = s.GetCommand(ctx, id); err != nil {
			return store.Command{}, "", fmt.Errorf("waiting for command %d: %w", id, err)
		}
	}
	switch {
	case strings.HasPrefix(cmd.Outcome, store.OutcomeFinishedPrefix):
		return cmd, t.Status, &TooLateError{ID: t.ID, Status: t.Status}
	case !cmd.Acked() && t.Status.Terminal():
		return cmd, t.Status, &TooLateError{ID: t.ID, Status: t.Status}
	}
	return cmd, t.Status, nil
}
