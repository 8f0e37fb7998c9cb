package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/store"
)

const commandColumns = `id, task_id, kind, reason, issued_by, issued_at, owner, acked_at, acked_by, outcome`

// issueCommandSQL records the command with the task's current owner (none
// unless the task is active) and announces it on TopicCommands as
// "<id> <owner>", in one statement. No row means no such task.
//
// The owner is read without locking the task: a claim racing with the
// command may leave it stale, which only affects whom the notification
// wakes. PendingCommands follows the task's owner at the time of asking.
var issueCommandSQL = `
WITH t AS (
    SELECT id, CASE WHEN status IN ` + activeStatusesSQL + ` THEN owner END AS owner
    FROM flotilla_tasks WHERE id = $1
), c AS (
    INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
    SELECT t.id, $2, $3, $4, statement_timestamp(), t.owner FROM t
    RETURNING ` + commandColumns + `
), notified AS (
    SELECT pg_notify('` + string(store.TopicCommands) + `', id::text || ' ' || coalesce(owner, '')) FROM c
)
SELECT ` + commandColumns + `, (SELECT count(*) FROM notified) FROM c`

// IssueCommand records a command for a task and announces it.
func (s *Store) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	switch c.Kind {
	case store.CommandStop, store.CommandPause, store.CommandResume:
	default:
		return store.Command{}, fmt.Errorf("command %q for task %d: the kinds are %s, %s and %s: %w",
			c.Kind, c.TaskID, store.CommandStop, store.CommandPause, store.CommandResume, store.ErrInvalid)
	}
	var notified int64
	cmd, err := scanCommand(s.pool.QueryRow(ctx, issueCommandSQL, c.TaskID, c.Kind, c.Reason, c.IssuedBy), &notified)
	if err != nil {
		return store.Command{}, wrap(err, "%s command for task %d", c.Kind, c.TaskID)
	}
	return cmd, nil
}

// pendingCommandsSQL starts from the unacknowledged commands (a small
// partial index) and probes each one's task: the task's owner now, not the
// one recorded when the command was issued, decides who applies it.
var pendingCommandsSQL = `
SELECT c.id, c.task_id, c.kind, c.reason, c.issued_by, c.issued_at, c.owner, c.acked_at, c.acked_by, c.outcome
FROM flotilla_commands c
JOIN flotilla_tasks t ON t.id = c.task_id
WHERE c.acked_at IS NULL AND t.owner = $1 AND t.status IN ` + activeStatusesSQL + `
ORDER BY c.id`

// PendingCommands lists unacknowledged commands for the active tasks that
// owner holds, oldest first.
func (s *Store) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	rows, err := s.pool.Query(ctx, pendingCommandsSQL, owner)
	if err != nil {
		return nil, wrap(err, "pending commands of %s", owner)
	}
	defer rows.Close()
	var out []store.Command
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, wrap(err, "pending commands of %s", owner)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "pending commands of %s", owner)
	}
	return out, nil
}

const ackCommandSQL = `
UPDATE flotilla_commands SET acked_at = statement_timestamp(), acked_by = $2, outcome = $3
WHERE id = $1 AND acked_at IS NULL
RETURNING ` + commandColumns

const getCommandSQL = `SELECT ` + commandColumns + ` FROM flotilla_commands WHERE id = $1`

// AckCommand records that a command was applied. A command acknowledged
// before keeps its first answer, which is returned with store.ErrConflict.
func (s *Store) AckCommand(ctx context.Context, id int64, by, outcome string) (store.Command, error) {
	cmd, err := scanCommand(s.pool.QueryRow(ctx, ackCommandSQL, id, by, outcome))
	if err == nil {
		return cmd, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return store.Command{}, wrap(err, "acknowledge command %d", id)
	}
	cmd, err = s.GetCommand(ctx, id)
	if err != nil {
		return store.Command{}, err
	}
	return cmd, fmt.Errorf("command %d was already acknowledged by %s (%s): %w", id, cmd.AckedBy, cmd.Outcome, store.ErrConflict)
}

// GetCommand reads one command.
func (s *Store) GetCommand(ctx context.Context, id int64) (store.Command, error) {
	cmd, err := scanCommand(s.pool.QueryRow(ctx, getCommandSQL, id))
	if err != nil {
		return store.Command{}, wrap(err, "command %d", id)
	}
	return cmd, nil
}

// scanCommand reads commandColumns, then extra columns into extra.
func scanCommand(row pgx.Row, extra ...any) (store.Command, error) {
	var (
		c       store.Command
		owner   pgtype.Text
		ackedAt pgtype.Timestamptz
	)
	dest := append([]any{&c.ID, &c.TaskID, &c.Kind, &c.Reason, &c.IssuedBy, &c.IssuedAt, &owner, &ackedAt,
		&c.AckedBy, &c.Outcome}, extra...)
	if err := row.Scan(dest...); err != nil {
		return store.Command{}, err
	}
	c.IssuedAt = c.IssuedAt.UTC()
	c.Owner = owner.String
	c.AckedAt = optTime(ackedAt)
	return c, nil
}
