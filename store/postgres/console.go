package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	retriedAsSQL   = `SELECT retry_id FROM flotilla_task_retries WHERE task_id = $1`
	insertRetrySQL = `INSERT INTO flotilla_task_retries (task_id, retry_id, retried_by, reason, at)
VALUES ($1, $2, $3, $4, statement_timestamp())`
	// The pipeline of a step is read before its row is locked: a retry of
	// a step locks the pipeline first, then rows of its tasks, in the
	// order RetryPipeline and appends take them.
	pipelineOfSQL = `SELECT pipeline_id FROM flotilla_tasks WHERE id = $1`
)

var getTaskForUpdateSQL = getTaskSQL + ` FOR UPDATE`

// RetryTask runs a task that ended without success again, as a new task,
// in one transaction: the task's row lock (or its pipeline's, for a step)
// orders two retries of it, and the link's primary key refuses the second.
func (s *Store) RetryTask(ctx context.Context, req store.RetryRequest) (*task.Task, error) {
	var (
		out *task.Task
		due bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var pipeline *int64
		if err := tx.QueryRow(ctx, pipelineOfSQL, req.ID).Scan(&pipeline); err != nil {
			return wrap(err, "task %d", req.ID)
		}
		var h pipelineHead
		if pipeline != nil {
			var err error
			if h, err = readPipelineHead(ctx, tx, lockPipelineSQL, *pipeline); err != nil {
				return err
			}
		}
		t, err := scanLimitedTask(tx.QueryRow(ctx, getTaskForUpdateSQL, req.ID))
		if err != nil {
			return wrap(err, "task %d", req.ID)
		}
		var retriedAs int64
		if err := tx.QueryRow(ctx, retriedAsSQL, t.ID).Scan(&retriedAs); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return wrap(err, "retry links of task %d", t.ID)
		}
		if err := store.CheckRetry(t, retriedAs); err != nil {
			return err
		}
		link := func(old, fresh int64, step string) error {
			_, err := tx.Exec(ctx, insertRetrySQL, old, fresh, req.By, store.RetryReason(req, step))
			return wrap(err, "link task %d to its retry %d", old, fresh)
		}
		if pipeline == nil {
			nt := []store.NewTask{store.RetryTaskOf(t)}
			if err := s.validate(ctx, nt); err != nil {
				return err
			}
			created, err := insertTasks(ctx, tx, nt)
			if err != nil {
				return err
			}
			out = created[0]
			return link(t.ID, out.ID, "")
		}
		p, err := loadPipeline(ctx, tx, h)
		if err != nil {
			return err
		}
		step, err := store.RetryStepOf(p, t)
		if err != nil {
			return err
		}
		var (
			after store.Pipeline
			names []string
		)
		if after, names, due, err = retryFrom(ctx, tx, h, p, step); err != nil {
			return err
		}
		cur, _ := after.Step(step)
		out = cur.Task
		return store.LinkRetried(p, after, names, link)
	})
	if err != nil {
		return nil, err
	}
	if due {
		s.announce(ctx, []int{out.Bucket})
	}
	return out, nil
}

const taskRetriesSQL = `
SELECT (SELECT count(*) FROM flotilla_tasks WHERE id = $1), r.task_id, r.retry_id, r.retried_by, r.at
FROM (SELECT 1) one
LEFT JOIN flotilla_task_retries r ON r.task_id = $1 OR r.retry_id = $1`

// TaskRetries reads a task's retry links, both ways, in one statement.
func (s *Store) TaskRetries(ctx context.Context, id int64) (store.Retries, error) {
	rows, err := s.pool.Query(ctx, taskRetriesSQL, id)
	if err != nil {
		return store.Retries{}, wrap(err, "retry links of task %d", id)
	}
	var (
		out     store.Retries
		exists  int64
		taskID  *int64
		retryID *int64
		by      *string
		at      *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&exists, &taskID, &retryID, &by, &at}, func() error {
		if taskID == nil {
			return nil
		}
		l := store.RetryLink{TaskID: *taskID, RetryID: *retryID, By: *by, At: at.UTC()}
		if l.TaskID == id {
			out.As = &l
		} else {
			out.Of = &l
		}
		return nil
	})
	if err != nil {
		return store.Retries{}, wrap(err, "retry links of task %d", id)
	}
	if exists == 0 {
		return store.Retries{}, wrap(pgx.ErrNoRows, "task %d", id)
	}
	return out, nil
}

// listPipelinesSQL reads one page of pipelines by primary key, newest
// first, and counts each one's steps by the state of their current tasks:
// its tasks come from flotilla_pipeline_steps, the newest per step.
const listPipelinesSQL = `
WITH page AS (
    SELECT id, name, key, bucket, created_at FROM flotilla_pipelines
    WHERE id < $1 ORDER BY id DESC LIMIT $2
), current AS (
    SELECT DISTINCT ON (ps.pipeline_id, t.step) ps.pipeline_id, t.status
    FROM page p
    JOIN flotilla_pipeline_steps ps ON ps.pipeline_id = p.id
    JOIN flotilla_tasks t ON t.id = ps.task_id
    ORDER BY ps.pipeline_id, t.step, t.id DESC
)
SELECT p.id, p.name, p.key, p.bucket, p.created_at, c.status, count(c.status)
FROM page p LEFT JOIN current c ON c.pipeline_id = p.id
GROUP BY p.id, p.name, p.key, p.bucket, p.created_at, c.status
ORDER BY p.id DESC`

// ListPipelines lists pipelines newest first with their steps counted.
func (s *Store) ListPipelines(ctx context.Context, f store.PipelineFilter) ([]store.PipelineSummary, error) {
	before := f.BeforeID
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.pool.Query(ctx, listPipelinesSQL, before, f.ListLimit())
	if err != nil {
		return nil, wrap(err, "list pipelines")
	}
	out := []store.PipelineSummary{}
	var (
		p      store.PipelineSummary
		b      int32
		status *string
		count  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&p.ID, &p.Name, &p.Key, &b, &p.CreatedAt, &status, &count}, func() error {
		if len(out) == 0 || out[len(out)-1].ID != p.ID {
			p.Bucket, p.CreatedAt, p.Steps = int(b), p.CreatedAt.UTC(), map[task.Status]int{}
			out = append(out, p)
		}
		if status != nil {
			out[len(out)-1].Steps[task.Status(*status)] = int(count)
		}
		return nil
	})
	if err != nil {
		return nil, wrap(err, "list pipelines")
	}
	return out, nil
}

// unfinishedByKindSQL counts by kind and state the rows of the claim and
// active partial indexes, one branch per index as backlogSQL does, so that
// neither branch reads a finished task.
var unfinishedByKindSQL = `
SELECT kind, status, count(*) FROM flotilla_tasks WHERE status IN ` + claimableStatusesSQL + ` GROUP BY kind, status
UNION ALL
SELECT kind, status, count(*) FROM flotilla_tasks WHERE status IN ` + activeStatusesSQL + ` GROUP BY kind, status`

// UnfinishedByKind counts the claimable and active tasks by kind and state.
func (s *Store) UnfinishedByKind(ctx context.Context) ([]store.KindCount, error) {
	rows, err := s.pool.Query(ctx, unfinishedByKindSQL)
	if err != nil {
		return nil, wrap(err, "count tasks by kind")
	}
	out := []store.KindCount{}
	var (
		c  store.KindCount
		st string
		n  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&c.Kind, &st, &n}, func() error {
		c.Status, c.Count = task.Status(st), int(n)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, wrap(err, "count tasks by kind")
	}
	store.SortKindCounts(out)
	return out, nil
}

// addMinuteCountsSQL adds a node's counts to its rows and removes the rows
// past store.MinuteCountsKept ($6, in microseconds), by the primary key's
// leading minute.
const addMinuteCountsSQL = `
WITH gone AS (
    DELETE FROM flotilla_task_minutes WHERE minute < statement_timestamp() - $6::bigint * interval '1 microsecond'
)
INSERT INTO flotilla_task_minutes (minute, node, kind, status, count)
SELECT m, $1::text, k, st, n FROM unnest($2::timestamptz[], $3::text[], $4::text[], $5::bigint[]) AS c(m, k, st, n)
ON CONFLICT (minute, node, kind, status) DO UPDATE SET count = flotilla_task_minutes.count + excluded.count`

// AddMinuteCounts adds a node's per-minute counts in one statement.
func (s *Store) AddMinuteCounts(ctx context.Context, node string, counts []store.MinuteCount) error {
	if err := store.CheckMinuteCounts(node, counts); err != nil {
		return err
	}
	n := len(counts)
	minutes, kinds, statuses, ns := make([]time.Time, n), make([]string, n), make([]string, n), make([]int64, n)
	for i, c := range counts {
		minutes[i], kinds[i], statuses[i], ns[i] = c.Minute.UTC(), c.Kind, string(c.Status), int64(c.Count)
	}
	_, err := s.pool.Exec(ctx, addMinuteCountsSQL, node, minutes, kinds, statuses, ns, store.MinuteCountsKept.Microseconds())
	return wrap(err, "add the per-minute counts of node %s", node)
}

const minuteCountsSQL = `
SELECT minute, kind, status, sum(count)::bigint FROM flotilla_task_minutes
WHERE minute >= $1 GROUP BY minute, kind, status ORDER BY minute, kind, status`

// MinuteCounts sums every node's counts from since on.
func (s *Store) MinuteCounts(ctx context.Context, since time.Time) ([]store.MinuteCount, error) {
	rows, err := s.pool.Query(ctx, minuteCountsSQL, since)
	if err != nil {
		return nil, wrap(err, "read per-minute counts")
	}
	out := []store.MinuteCount{}
	var (
		c  store.MinuteCount
		st string
		n  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&c.Minute, &c.Kind, &st, &n}, func() error {
		c.Minute, c.Status, c.Count = c.Minute.UTC(), task.Status(st), int(n)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, wrap(err, "read per-minute counts")
	}
	// In Go's order of kinds, which the database's collation need not be.
	store.SortMinuteCounts(out)
	return out, nil
}
