package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const commandColumns = `id, task_id, kind, reason, issued_by, issued_at, owner, acked_at, acked_by, outcome`

// issueLockSQL locks the task a command is for and reads what
// store.CheckCommandTarget decides on.
var issueLockSQL = `
SELECT status, status_version, CASE WHEN status IN ` + activeStatusesSQL + ` THEN owner END, claim_seq
FROM flotilla_tasks WHERE id = $1
FOR UPDATE`

// issueFlagSQL records a stop or pause on the locked task row, where every
// move of the task reads it.
const issueFlagSQL = `
UPDATE flotilla_tasks
SET stop_requested = stop_requested OR $2 = 'stop', pause_requested = pause_requested OR $2 = 'pause'
WHERE id = $1`

// issueInsertSQL records the command with the task's current owner (none
// unless the task is active) and announces it on TopicCommands as a
// store.CommandNote, "<id> <owner> <task id> <claim_seq> <kind> <issued at
// µs> <issued by> <reason>", with the claim_seq ($6) read under the task's
// row lock.
var noteTextRunes = strconv.Itoa(store.NoteTextRunes)

var issueInsertSQL = `
WITH c AS (
    INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
    VALUES ($1, $2, $3, $4, statement_timestamp(), $5)
    RETURNING ` + commandColumns + `
), notified AS (
    SELECT pg_notify('` + string(store.TopicCommands) + `',
        id::text || ' ' || coalesce(owner, '') || ' ' || task_id::text || ' ' || $6::bigint::text || ' ' || kind
            || ' ' || floor(extract(epoch FROM issued_at) * 1000000)::bigint::text
            || ' ' || encode(convert_to(left(issued_by, ` + noteTextRunes + `), 'UTF8'), 'hex')
            || ' ' || encode(convert_to(left(reason, ` + noteTextRunes + `), 'UTF8'), 'hex')) FROM c
)
SELECT ` + commandColumns + `, (SELECT count(*) FROM notified) FROM c`

// IssueCommand records a command for a task and announces it, in one
// transaction that holds the task's row lock: the check of the task's state,
// its request flag and the command row agree with every move of the task,
// which takes the same lock.
func (s *Store) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	switch c.Kind {
	case store.CommandStop, store.CommandPause, store.CommandResume:
	default:
		return store.Command{}, fmt.Errorf("command %q for task %d: the kinds are %s, %s and %s: %w",
			c.Kind, c.TaskID, store.CommandStop, store.CommandPause, store.CommandResume, store.ErrInvalid)
	}
	var cmd store.Command
	err := s.batchedTx(ctx, func(conn *pgx.Conn) error {
		var err error
		cmd, err = issue(ctx, conn, c)
		return err
	})
	if err != nil {
		return store.Command{}, err // issue says which command
	}
	return cmd, nil
}

// issue runs IssueCommand's transaction in two round trips, as a stop's
// latency counts them: the BEGIN with the locking read, then the writes
// with the COMMIT, once store.CheckCommandTarget has passed on what the
// read returned.
func issue(ctx context.Context, conn *pgx.Conn, c store.NewCommand) (store.Command, error) {
	var (
		status   string
		version  int64
		owner    pgtype.Text
		claimSeq int64
	)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(issueLockSQL, c.TaskID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&status, &version, &owner, &claimSeq)
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return store.Command{}, wrap(err, "%s command for task %d", c.Kind, c.TaskID)
	}
	if err := store.CheckCommandTarget(c, task.Status(status), version); err != nil {
		return store.Command{}, err
	}
	var (
		cmd      store.Command
		notified int64
		scanErr  error
	)
	b = &pgx.Batch{}
	if c.Kind != store.CommandResume {
		b.Queue(issueFlagSQL, c.TaskID, c.Kind)
	}
	b.Queue(issueInsertSQL, c.TaskID, c.Kind, c.Reason, c.IssuedBy, owner, claimSeq).QueryRow(func(row pgx.Row) error {
		cmd, scanErr = scanCommand(row, &notified)
		return scanErr
	})
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
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
