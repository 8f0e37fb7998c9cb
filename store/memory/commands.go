package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// IssueCommand records a command for a task with the task's current owner,
// and announces it to listeners (store.CommandNote).
func (s *Store) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	switch c.Kind {
	case store.CommandStop, store.CommandPause, store.CommandResume:
	default:
		return store.Command{}, fmt.Errorf("%w: unknown command %q: valid commands are %s, %s and %s",
			store.ErrInvalid, c.Kind, store.CommandStop, store.CommandPause, store.CommandResume)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Command{}, err
	}
	defer db.mu.Unlock()

	rec := db.task(c.TaskID)
	if rec == nil {
		return store.Command{}, taskNotFound(c.TaskID)
	}
	if err := store.CheckCommandTarget(c, rec.Status, rec.StatusVersion); err != nil {
		return store.Command{}, err
	}
	switch c.Kind {
	case store.CommandStop:
		rec.StopRequested = true
	case store.CommandPause:
		rec.PauseRequested = true
	}
	cmd := &store.Command{
		ID:       int64(len(db.commands) + 1),
		TaskID:   c.TaskID,
		Kind:     c.Kind,
		Reason:   c.Reason,
		IssuedBy: c.IssuedBy,
		IssuedAt: db.now(),
	}
	if rec.Status.Active() {
		cmd.Owner = rec.Owner
	}
	db.commands = append(db.commands, cmd)
	db.commandsByTask[c.TaskID] = append(db.commandsByTask[c.TaskID], cmd)
	db.publish(store.TopicCommands, store.CommandNote{
		ID: cmd.ID, Owner: cmd.Owner, TaskID: rec.ID, ClaimSeq: rec.ClaimSeq, Kind: cmd.Kind, IssuedAt: cmd.IssuedAt,
		IssuedBy: cmd.IssuedBy, Reason: cmd.Reason,
	}.Payload())
	out := *cmd
	out.TaskStatus, out.TaskNode = rec.Status, rec.Node
	return out, nil
}

// ackLeft answers the pending commands of a task that has just left the
// active states or reached a final state, as the move's own answer: a stop
// honoured by a move to stopped is acknowledged "stopped", a pause honoured
// by a move to paused "paused" (whoever made the move: the node that ran the
// task, or the reconcile of its next holder); any other command is
// acknowledged "already finished: <status>", so that nobody waits on a
// command that can no longer apply.
func (db *database) ackLeft(taskID int64, status task.Status, by string, now time.Time) {
	for _, cmd := range db.commandsByTask[taskID] {
		if cmd.Acked() {
			continue
		}
		cmd.AckedAt, cmd.AckedBy, cmd.Outcome = now, by, store.LeftOutcome(cmd.Kind, status)
	}
}

// PendingCommands lists the unacknowledged commands of the active tasks that
// owner holds now, oldest first. The task's current owner decides, not the
// one recorded at issue: a command issued before a claim reaches the node
// that claimed the task.
func (s *Store) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	out := []store.Command{}
	for _, cmd := range db.commands {
		if cmd == nil || cmd.Acked() {
			continue
		}
		if rec := db.task(cmd.TaskID); rec.Status.Active() && rec.Owner == owner {
			out = append(out, *cmd)
		}
	}
	return out, nil
}

func (db *database) command(id int64) (*store.Command, error) {
	if id < 1 || id > int64(len(db.commands)) || db.commands[id-1] == nil {
		return nil, fmt.Errorf("command %d: %w", id, store.ErrNotFound)
	}
	return db.commands[id-1], nil
}

// AckCommand records that a command was applied. The first answer stands:
// a second acknowledgement returns the command as first acknowledged, with
// ErrConflict.
func (s *Store) AckCommand(ctx context.Context, id int64, by, outcome string) (store.Command, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Command{}, err
	}
	defer db.mu.Unlock()
	cmd, err := db.command(id)
	if err != nil {
		return store.Command{}, err
	}
	if cmd.Acked() {
		return *cmd, fmt.Errorf("command %d was already acknowledged by %s (%s): %w",
			id, cmd.AckedBy, cmd.Outcome, store.ErrConflict)
	}
	cmd.AckedAt = db.now()
	cmd.AckedBy = by
	cmd.Outcome = outcome
	return *cmd, nil
}

// GetCommand reads one command.
func (s *Store) GetCommand(ctx context.Context, id int64) (store.Command, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Command{}, err
	}
	defer db.mu.Unlock()
	cmd, err := db.command(id)
	if err != nil {
		return store.Command{}, err
	}
	return *cmd, nil
}
