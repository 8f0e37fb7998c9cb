package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const commandColumns = `id, task_id, kind, reason, issued_by, issued_at, owner, acked_at, acked_by, outcome`

func scanCommand(row scanner) (store.Command, error) {
	var (
		c             store.Command
		issued, acked sql.NullInt64
		owner         sql.NullString
	)
	if err := row.Scan(&c.ID, &c.TaskID, &c.Kind, &c.Reason, &c.IssuedBy, &issued, &owner, &acked, &c.AckedBy, &c.Outcome); err != nil {
		return store.Command{}, err
	}
	c.IssuedAt, c.AckedAt, c.Owner = fromMicros(issued), fromMicros(acked), owner.String
	return c, nil
}

// IssueCommand records a command for a task with the task's current owner,
// sets the task's request flag, and announces it as "<command id> <owner>".
func (s *Store) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	switch c.Kind {
	case store.CommandStop, store.CommandPause, store.CommandResume:
	default:
		return store.Command{}, fmt.Errorf("%w: unknown command %q: valid commands are %s, %s and %s",
			store.ErrInvalid, c.Kind, store.CommandStop, store.CommandPause, store.CommandResume)
	}
	var out store.Command
	err := s.write(ctx, func(tx *wtx) error {
		t, err := loadTask(tx, c.TaskID)
		if err != nil {
			return err
		}
		if t == nil {
			return taskNotFound(c.TaskID)
		}
		if err := store.CheckCommandTarget(c, t.Status, t.StatusVersion); err != nil {
			return err
		}
		switch c.Kind {
		case store.CommandStop:
			_, err = tx.exec(`UPDATE flotilla_tasks SET stop_requested = 1 WHERE id = ?`, t.ID)
		case store.CommandPause:
			_, err = tx.exec(`UPDATE flotilla_tasks SET pause_requested = 1 WHERE id = ?`, t.ID)
		}
		if err != nil {
			return wrap(err, "flag task %d", t.ID)
		}
		owner := ""
		if t.Status.Active() {
			owner = t.Owner
		}
		out, err = scanCommand(tx.queryRow(`INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
			VALUES (?, ?, ?, ?, ?, ?) RETURNING `+commandColumns,
			c.TaskID, c.Kind, c.Reason, c.IssuedBy, tx.now.UnixMicro(), nullString(owner)))
		if err != nil {
			return wrap(err, "record the command")
		}
		tx.notify(store.TopicCommands, store.CommandNote{
			ID: out.ID, Owner: out.Owner, TaskID: t.ID, ClaimSeq: t.ClaimSeq, Kind: out.Kind, IssuedAt: out.IssuedAt,
			IssuedBy: out.IssuedBy, Reason: out.Reason,
		}.Payload())
		out.TaskStatus, out.TaskNode = t.Status, t.Node
		return nil
	})
	if err != nil {
		return store.Command{}, requireSchema(err)
	}
	return out, nil
}

// ackLeft answers the pending commands of a task that has just left the
// active states or reached a final state, as the move's own answer (see
// store.LeftOutcome).
func ackLeft(tx *wtx, taskID int64, status task.Status, by string) error {
	var ps []pendingCommand
	if tx.pending != nil {
		ps = tx.pending[taskID]
		delete(tx.pending, taskID)
	} else {
		var err error
		if ps, err = pendingOf(tx, taskID); err != nil {
			return err
		}
	}
	for _, p := range ps {
		if _, err := tx.exec(`UPDATE flotilla_commands SET acked_at = ?, acked_by = ?, outcome = ? WHERE id = ?`,
			tx.now.UnixMicro(), by, store.LeftOutcome(p.kind, status), p.id); err != nil {
			return wrap(err, "acknowledge command %d", p.id)
		}
	}
	return nil
}

// pendingCommand is an unacknowledged command of a task.
type pendingCommand struct {
	id   int64
	kind string
}

func pendingOf(tx *wtx, taskID int64) ([]pendingCommand, error) {
	rows, err := tx.query(`SELECT id, kind FROM flotilla_commands WHERE task_id = ? AND acked_at IS NULL`, taskID)
	if err != nil {
		return nil, wrap(err, "pending commands of task %d", taskID)
	}
	defer rows.Close()
	var ps []pendingCommand
	for rows.Next() {
		var p pendingCommand
		if err := rows.Scan(&p.id, &p.kind); err != nil {
			return nil, wrap(err, "pending commands of task %d", taskID)
		}
		ps = append(ps, p)
	}
	return ps, wrapIf(rows.Err(), fmt.Sprintf("pending commands of task %d", taskID))
}

// PendingCommands lists the unacknowledged commands of the active tasks
// that owner holds now, oldest first. The task's current owner decides,
// not the one recorded at issue.
func (s *Store) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+prefixed("c.", commandColumns)+`
		FROM flotilla_commands c JOIN flotilla_tasks t ON t.id = c.task_id
		WHERE c.acked_at IS NULL AND t.status IN ('running', 'stopping', 'pausing') AND t.owner = ?
		ORDER BY c.id`, owner)
	if err != nil {
		return nil, requireSchema(wrap(err, "pending commands"))
	}
	defer rows.Close()
	out := []store.Command{}
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, wrap(err, "pending commands")
		}
		out = append(out, c)
	}
	return out, wrapIf(rows.Err(), "pending commands")
}

// AckCommand records that a command was applied. The first answer stands:
// a second acknowledgement returns the command as first acknowledged, with
// ErrConflict.
func (s *Store) AckCommand(ctx context.Context, id int64, by, outcome string) (store.Command, error) {
	var out store.Command
	err := s.write(ctx, func(tx *wtx) error {
		c, err := scanCommand(tx.queryRow(`SELECT `+commandColumns+` FROM flotilla_commands WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("command %d: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return wrap(err, "read command %d", id)
		}
		if c.Acked() {
			out = c
			return fmt.Errorf("command %d was already acknowledged by %s (%s): %w", id, c.AckedBy, c.Outcome, store.ErrConflict)
		}
		c.AckedAt, c.AckedBy, c.Outcome = tx.now, by, outcome
		if _, err := tx.exec(`UPDATE flotilla_commands SET acked_at = ?, acked_by = ?, outcome = ? WHERE id = ?`,
			tx.now.UnixMicro(), by, outcome, id); err != nil {
			return wrap(err, "acknowledge command %d", id)
		}
		out = c
		return nil
	})
	return out, requireSchema(err)
}

// GetCommand reads one command.
func (s *Store) GetCommand(ctx context.Context, id int64) (store.Command, error) {
	if err := s.checkOpen(); err != nil {
		return store.Command{}, err
	}
	c, err := scanCommand(s.rdb.QueryRowContext(ctx, `SELECT `+commandColumns+` FROM flotilla_commands WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Command{}, fmt.Errorf("command %d: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Command{}, requireSchema(wrap(err, "read command %d", id))
	}
	return c, nil
}
