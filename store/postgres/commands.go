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

// noteTextRunes bounds the issuer and reason a command's notification
// carries.
var noteTextRunes = strconv.Itoa(store.NoteTextRunes)

// issueSQL is IssueCommand in one statement, so that a stop costs its
// issuer one round trip and one commit. It locks the task's row, decides on
// it as store.CheckCommandTarget does ($5: the expected status version, 0
// for any), and, when the task is a target, records a stop or pause on the
// row (where every move of the task reads it), records the command with
// the task's current owner (none unless the task is active), and announces
// it on TopicCommands as a store.CommandNote, "<id> <owner> <task id>
// <claim_seq> <kind> <issued at µs> <issued by> <reason>", with the
// claim_seq read under the row lock. The task's status, version and node
// come back whether or not it was a target: no row means no such task, a
// row with no command a refusal, which CheckCommandTarget then words.
var issueSQL = `
WITH target AS (
    SELECT id, status, status_version, node, claim_seq,
           CASE WHEN status IN ` + activeStatusesSQL + ` THEN owner END AS owner
    FROM flotilla_tasks WHERE id = $1
    FOR UPDATE
), allowed AS (
    SELECT * FROM target
    WHERE ($5::bigint = 0 OR status_version = $5::bigint)
      AND CASE $2::text WHEN 'stop' THEN status IN ` + activeStatusesSQL + `
                        WHEN 'pause' THEN status = 'running'
                        ELSE true END
), flagged AS (
    UPDATE flotilla_tasks t
    SET stop_requested = t.stop_requested OR $2::text = 'stop',
        pause_requested = t.pause_requested OR $2::text = 'pause'
    FROM allowed a
    WHERE t.id = a.id AND $2::text <> 'resume'
), c AS (
    INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
    SELECT a.id, $2::text, $3::text, $4::text, statement_timestamp(), a.owner FROM allowed a
    RETURNING id, issued_at, owner
), notified AS (
    SELECT pg_notify('` + string(store.TopicCommands) + `',
        c.id::text || ' ' || coalesce(c.owner, '') || ' ' || $1::bigint::text || ' ' || a.claim_seq::text
            || ' ' || $2::text
            || ' ' || floor(extract(epoch FROM c.issued_at) * 1000000)::bigint::text
            || ' ' || encode(convert_to(left($4::text, ` + noteTextRunes + `), 'UTF8'), 'hex')
            || ' ' || encode(convert_to(left($3::text, ` + noteTextRunes + `), 'UTF8'), 'hex'))
    FROM c, allowed a
)
SELECT t.status, t.status_version, t.node, c.id, c.issued_at, c.owner, (SELECT count(*) FROM notified)
FROM target t LEFT JOIN c ON true`

// IssueCommand records a command for a task and announces it, in one
// statement that holds the task's row lock: the check of the task's state,
// its request flag and the command row agree with every move of the task,
// which takes the same lock. The statement goes in one round trip with its
// transaction's BEGIN, its setting and its COMMIT. It runs on its generic
// plan (genericPlanSQL): planning it for each command cost 0.23 ms, twice
// the 0.12 ms of running it, in the stop's path to the handler. Each of its
// reads is of one task by its primary key, which the planner reads by that
// index whatever the table held when the connection made the plan
// (TestTheCommandsPlanStaysOnThePrimaryKey).
func (s *Store) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	switch c.Kind {
	case store.CommandStop, store.CommandPause, store.CommandResume:
	default:
		return store.Command{}, fmt.Errorf("command %q for task %d: the kinds are %s, %s and %s: %w",
			c.Kind, c.TaskID, store.CommandStop, store.CommandPause, store.CommandResume, store.ErrInvalid)
	}
	var (
		status   string
		version  int64
		node     string
		id       pgtype.Int8
		issuedAt pgtype.Timestamptz
		owner    pgtype.Text
		notified int64
	)
	err := s.batchedTx(ctx, func(conn *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(genericPlanSQL)
		b.Queue(issueSQL, c.TaskID, c.Kind, c.Reason, c.IssuedBy, c.ExpectVersion).QueryRow(func(row pgx.Row) error {
			return row.Scan(&status, &version, &node, &id, &issuedAt, &owner, &notified)
		})
		b.Queue("COMMIT")
		return conn.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return store.Command{}, wrap(err, "%s command for task %d", c.Kind, c.TaskID)
	}
	if !id.Valid {
		if err := store.CheckCommandTarget(c, task.Status(status), version); err != nil {
			return store.Command{}, err
		}
		// The statement and CheckCommandTarget disagree: a defect, worded
		// so that it is found.
		return store.Command{}, fmt.Errorf("%s command for task %d: refused by the database on a task %s at version %d, "+
			"which the command rules accept", c.Kind, c.TaskID, status, version)
	}
	return store.Command{
		ID: id.Int64, TaskID: c.TaskID, Kind: c.Kind, Reason: c.Reason, IssuedBy: c.IssuedBy,
		IssuedAt: issuedAt.Time.UTC(), Owner: owner.String,
		TaskStatus: task.Status(status), TaskNode: node,
	}, nil
}

// pendingCommandsSQL starts from the unacknowledged commands (a small
// partial index) and probes each one's task: the task's owner now, not the
// one recorded when the command was issued, decides who applies it. The
// probe is a subquery per command, not a join, so that the planner cannot
// start from the tasks: from statistics taken while few tasks ran, it
// walked the active tasks' index once per command, every running task of
// the fleet at each poll of each node (TestPendingCommandsStartFromTheCommands).
//
// Every node reads its pending commands once a second, and planning the
// read cost 0.39 ms, several times running it (nearly always on an empty
// index): a sixth of what an idle fleet of 64 nodes cost the database. So
// it runs on its generic plan, which starts from the pending commands'
// index and probes each task by its primary key whatever the tables held
// when the connection made it (the same test).
var pendingCommandsSQL = `
SELECT c.id, c.task_id, c.kind, c.reason, c.issued_by, c.issued_at, c.owner, c.acked_at, c.acked_by, c.outcome
FROM flotilla_commands c
WHERE c.acked_at IS NULL
  AND (SELECT t.owner = $1 AND t.status IN ` + activeStatusesSQL + ` FROM flotilla_tasks t WHERE t.id = c.task_id)
ORDER BY c.id`

// PendingCommands lists unacknowledged commands for the active tasks that
// owner holds, oldest first.
func (s *Store) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	var out []store.Command
	err := s.readOnItsPlan(ctx, genericPlanSQL, pendingCommandsSQL, []any{owner}, func(rows pgx.Rows) error {
		for rows.Next() {
			c, err := scanCommand(rows)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
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
