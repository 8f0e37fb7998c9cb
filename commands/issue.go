package commands

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// maxConflicts bounds how often a request is decided again because the task
// moved between the read and the compare-and-set. Each conflict is a real
// transition of the task, so a handful means a task that changes state
// faster than anyone can watch it.
const maxConflicts = 10

// Result is what a request did.
type Result struct {
	TaskID int64
	Kind   string      // store.CommandStop, CommandPause or CommandResume
	From   task.Status // the task's state when the request was decided
	// Status is the task's state after a direct change, or From when a
	// command was issued for its holder.
	Status task.Status
	// Node runs the task when a command was issued ("" otherwise).
	Node string
	// Command is the command issued for the task's holder; its ID is 0 when
	// the request was applied directly.
	Command store.Command
}

// Direct reports whether the request was applied at once, with no node
// involved.
func (r Result) Direct() bool { return r.Command.ID == 0 }

// Stop stops a task: one that no node runs becomes cancelled at once; a
// running one gets a stop command, which its holder applies (-> stopping ->
// stopped). A task already cancelled or stopped is reported as it is. A
// finished task is *TooLateError; a missing one matches store.ErrNotFound.
func Stop(ctx context.Context, s store.Store, id int64, reason, issuedBy string) (Result, error) {
	return decide(ctx, s, id, store.CommandStop, reason, issuedBy, func(t *task.Task) (action, error) {
		switch {
		case t.Status == task.Cancelled || t.Status == task.Stopped:
			return done, nil
		case t.Status.Terminal():
			return done, &TooLateError{ID: t.ID, Status: t.Status}
		case t.Status.Active():
			return issue, nil
		}
		return moveTo(task.Cancelled), nil
	})
}

// Pause pauses a task: one that waits to run (pending, scheduled, queued,
// retrying) becomes paused at once; a running one gets a pause command, and
// its handler is paused at its next checkpoint (task.Task.Checkpoint). A
// handler that never checkpoints just finishes. A pipeline step paused while
// pending goes on counting its dependencies down, but only a resume queues
// it.
func Pause(ctx context.Context, s store.Store, id int64, reason, issuedBy string) (Result, error) {
	return decide(ctx, s, id, store.CommandPause, reason, issuedBy, func(t *task.Task) (action, error) {
		switch t.Status {
		case task.Paused, task.Pausing:
			return done, nil
		case task.Running:
			return issue, nil
		case task.Pending, task.Scheduled, task.Queued, task.Retrying:
			return moveTo(task.Paused), nil
		}
		if t.Status.Terminal() {
			return done, &TooLateError{ID: t.ID, Status: t.Status}
		}
		return done, &StateError{ID: t.ID, Kind: store.CommandPause, Status: t.Status,
			Want: "only a pending, scheduled, queued, retrying or running task can be paused"}
	})
}

// Resume queues a paused task again; its next attempt sees the progress it
// saved. It involves no node. A pipeline step paused while it waited for
// dependencies that have not all ended goes back to pending (the store
// decides on the locked row: task.ResumeDestination).
//
// A task paused while it waited for its run_at (a delay, a retry's backoff)
// keeps waiting for it: it is scheduled again for the time that is left.
func Resume(ctx context.Context, s store.Store, id int64, reason, issuedBy string) (Result, error) {
	return decide(ctx, s, id, store.CommandResume, reason, issuedBy, func(t *task.Task) (action, error) {
		switch {
		case t.Status == task.Paused:
			now, err := s.Now(ctx)
			if err != nil {
				return done, fmt.Errorf("resume task %d: reading the database clock: %w", t.ID, err)
			}
			if left := t.RunAt.Sub(now); left > 0 {
				return action{to: task.Scheduled, delay: left}, nil
			}
			return moveTo(task.Queued), nil
		case t.Status.Terminal():
			return done, &TooLateError{ID: t.ID, Status: t.Status}
		}
		return done, &StateError{ID: t.ID, Kind: store.CommandResume, Status: t.Status,
			Want: "only a paused task can be resumed"}
	})
}

// action is what a request does to a task in the state it was read in:
// nothing (the zero action: it is already what was asked), a command for its
// holder (issue), or a direct move to a state.
type action struct {
	issue bool
	to    task.Status
	delay time.Duration // from the database's now, for a move to scheduled
}

var (
	done  = action{}
	issue = action{issue: true}
)

func moveTo(s task.Status) action { return action{to: s} }

// decide reads the task, asks choose what to do with it, and does it; a
// compare-and-set that finds the task moved on is decided again.
func decide(ctx context.Context, s store.Store, id int64, kind, reason, issuedBy string,
	choose func(*task.Task) (action, error)) (Result, error) {
	if res, ok, err := issueFirst(ctx, s, id, kind, reason, issuedBy); ok || err != nil {
		return res, err
	}
	for range maxConflicts {
		t, err := s.GetTask(ctx, id)
		if err != nil {
			return Result{}, fmt.Errorf("%s task %d: %w", kind, id, err)
		}
		act, err := choose(t)
		if err != nil {
			return Result{}, err
		}
		res := Result{TaskID: id, Kind: kind, From: t.Status, Status: t.Status}
		switch act {
		case done:
			return res, nil
		case issue:
			// Issued only on the task as it was read: a command decided on
			// a running task must not land on the task it became since (a
			// retry waiting to run again, which nothing would stop).
			cmd, err := s.IssueCommand(ctx, store.NewCommand{
				TaskID: id, Kind: kind, Reason: reason, IssuedBy: issuedBy, ExpectVersion: t.StatusVersion,
			})
			if errors.Is(err, store.ErrConflict) {
				continue // the task moved: decide again on what it is now
			}
			if err != nil {
				return Result{}, fmt.Errorf("%s task %d: %w", kind, id, err)
			}
			res.Command, res.Node = cmd, t.Node
			return res, nil
		}
		moved, err := s.Transition(ctx, store.Transition{
			ID: id, Version: t.StatusVersion, To: act.to, Reason: requested(kind, reason, issuedBy), Delay: act.delay,
		})
		switch {
		case err == nil:
			res.Status = moved.Status
			return res, nil
		case errors.Is(err, store.ErrConflict):
			continue // the task moved: decide again on what it is now
		default:
			return Result{}, fmt.Errorf("%s task %d: %w", kind, id, err)
		}
	}
	return Result{}, fmt.Errorf("%s task %d: it changed state %d times while the request was being applied: %w",
		kind, id, maxConflicts, store.ErrConflict)
}

// issueFirst issues a stop or a pause on the task as the store finds it
// under its row lock, without reading it first: most are for a running
// task, and the read would cost the issuer a round trip more before its
// handler is told. The store applies the rules the choices above apply to
// a command (store.CheckCommandTarget: a stop for an active task, a pause
// for a running one); ok is false when it refused the task as it is (or
// found none), and decide then reads it and chooses.
func issueFirst(ctx context.Context, s store.Store, id int64, kind, reason, issuedBy string) (res Result, ok bool, err error) {
	if kind != store.CommandStop && kind != store.CommandPause {
		return Result{}, false, nil
	}
	cmd, err := s.IssueCommand(ctx, store.NewCommand{TaskID: id, Kind: kind, Reason: reason, IssuedBy: issuedBy})
	switch {
	case err == nil:
		return Result{TaskID: id, Kind: kind, From: cmd.TaskStatus, Status: cmd.TaskStatus, Node: cmd.TaskNode,
			Command: cmd}, true, nil
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		return Result{}, false, nil
	}
	return Result{}, false, fmt.Errorf("%s task %d: %w", kind, id, err)
}

// requested is the audit reason of a direct change.
func requested(kind, reason, issuedBy string) string {
	s := kind + " requested"
	if issuedBy != "" {
		s += " by " + issuedBy
	}
	if reason != "" {
		s += ": " + reason
	}
	return s
}
