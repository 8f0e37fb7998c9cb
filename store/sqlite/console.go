package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// RetryTask runs a task that ended without success again, as a new task,
// in one write: the write lock keeps the task, its link and its pipeline as
// read until the new tasks are in.
func (s *Store) RetryTask(ctx context.Context, req store.RetryRequest) (*task.Task, error) {
	n, err := s.fleetSize(ctx)
	if err != nil {
		return nil, err
	}
	var out *task.Task
	err = s.write(ctx, func(tx *wtx) error {
		t, err := loadTask(tx, req.ID)
		if err != nil {
			return err
		}
		if t == nil {
			return taskNotFound(req.ID)
		}
		var retriedAs int64
		err = tx.queryRow(`SELECT retry_id FROM flotilla_task_retries WHERE task_id = ?`, t.ID).Scan(&retriedAs)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return wrap(err, "retry links of task %d", t.ID)
		}
		if err := store.CheckRetry(t, retriedAs); err != nil {
			return err
		}
		link := func(old, fresh int64, step string) error {
			_, err := tx.exec(`INSERT INTO flotilla_task_retries (task_id, retry_id, retried_by, reason, at) VALUES (?, ?, ?, ?, ?)`,
				old, fresh, req.By, store.RetryReason(req, step), tx.now.UnixMicro())
			if err != nil {
				return wrap(err, "link task %d to its retry %d", old, fresh)
			}
			return nil
		}
		if t.Pipeline == 0 {
			nt := []store.NewTask{store.RetryTaskOf(t)}
			if err := store.CheckNewTasks(nt, n); err != nil {
				return err
			}
			created, err := insertTasks(tx, nt, false)
			if err != nil {
				return err
			}
			out = created[0]
			return link(t.ID, out.ID, "")
		}
		h, err := readPipelineHead(tx.ctx, tx.conn, t.Pipeline)
		if err != nil {
			return err
		}
		p, err := loadPipeline(tx.ctx, tx.conn, h)
		if err != nil {
			return err
		}
		step, err := store.RetryStepOf(p, t)
		if err != nil {
			return err
		}
		after, names, err := retryFrom(tx, h, p, step)
		if err != nil {
			return err
		}
		cur, _ := after.Step(step)
		out = cur.Task
		return store.LinkRetried(p, after, names, link)
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// TaskRetries reads a task's retry links, both ways.
func (s *Store) TaskRetries(ctx context.Context, id int64) (store.Retries, error) {
	if err := s.checkOpen(); err != nil {
		return store.Retries{}, err
	}
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return store.Retries{}, wrap(err, "retry links of task %d", id)
	}
	defer func() { _ = tx.Rollback() }()
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM flotilla_tasks WHERE id = ?`, id).Scan(&exists); err != nil {
		return store.Retries{}, requireSchema(wrap(err, "retry links of task %d", id))
	}
	if exists == 0 {
		return store.Retries{}, taskNotFound(id)
	}
	rows, err := tx.QueryContext(ctx, `SELECT task_id, retry_id, retried_by, at FROM flotilla_task_retries
		WHERE task_id = ?1 OR retry_id = ?1`, id)
	if err != nil {
		return store.Retries{}, wrap(err, "retry links of task %d", id)
	}
	defer rows.Close()
	var out store.Retries
	for rows.Next() {
		var (
			l  store.RetryLink
			at int64
		)
		if err := rows.Scan(&l.TaskID, &l.RetryID, &l.By, &at); err != nil {
			return store.Retries{}, wrap(err, "retry links of task %d", id)
		}
		l.At = time.UnixMicro(at).UTC()
		if l.TaskID == id {
			out.As = &l
		} else {
			out.Of = &l
		}
	}
	return out, wrapIf(rows.Err(), "retry links")
}

// listPipelinesSQL counts, for each pipeline of the page, its steps by the
// state of their current tasks: the newest task of each step, found on
// flotilla_tasks_pipeline_idx.
const listPipelinesSQL = `
WITH page AS (
    SELECT id, name, key, bucket, created_at FROM flotilla_pipelines
    WHERE id < ?1 ORDER BY id DESC LIMIT ?2
), current AS (
    SELECT t.pipeline_id, t.status,
           row_number() OVER (PARTITION BY t.pipeline_id, t.step ORDER BY t.id DESC) AS newest
    FROM flotilla_tasks t WHERE t.pipeline_id IN (SELECT id FROM page)
)
SELECT p.id, p.name, p.key, p.bucket, p.created_at, c.status, count(c.status)
FROM page p LEFT JOIN current c ON c.pipeline_id = p.id AND c.newest = 1
GROUP BY p.id, c.status
ORDER BY p.id DESC`

// ListPipelines lists pipelines newest first with their steps counted.
func (s *Store) ListPipelines(ctx context.Context, f store.PipelineFilter) ([]store.PipelineSummary, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	before := f.BeforeID
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.rdb.QueryContext(ctx, listPipelinesSQL, before, f.ListLimit())
	if err != nil {
		return nil, requireSchema(wrap(err, "list pipelines"))
	}
	defer rows.Close()
	out := []store.PipelineSummary{}
	for rows.Next() {
		var (
			p       store.PipelineSummary
			created int64
			status  sql.NullString
			count   int
		)
		if err := rows.Scan(&p.ID, &p.Name, &p.Key, &p.Bucket, &created, &status, &count); err != nil {
			return nil, wrap(err, "list pipelines")
		}
		if len(out) == 0 || out[len(out)-1].ID != p.ID {
			p.CreatedAt, p.Steps = time.UnixMicro(created).UTC(), map[task.Status]int{}
			out = append(out, p)
		}
		if status.Valid {
			out[len(out)-1].Steps[task.Status(status.String)] = count
		}
	}
	return out, wrapIf(rows.Err(), "list pipelines")
}

// UnfinishedByKind counts the claimable and active tasks by kind and state.
func (s *Store) UnfinishedByKind(ctx context.Context) ([]store.KindCount, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT kind, status, count(*) FROM flotilla_tasks
		WHERE status IN ('scheduled', 'queued', 'retrying', 'running', 'stopping', 'pausing') GROUP BY kind, status`)
	if err != nil {
		return nil, requireSchema(wrap(err, "count tasks by kind"))
	}
	defer rows.Close()
	out := []store.KindCount{}
	for rows.Next() {
		var (
			c  store.KindCount
			st string
		)
		if err := rows.Scan(&c.Kind, &st, &c.Count); err != nil {
			return nil, wrap(err, "count tasks by kind")
		}
		c.Status = task.Status(st)
		out = append(out, c)
	}
	store.SortKindCounts(out)
	return out, wrapIf(rows.Err(), "count tasks by kind")
}

// AddMinuteCounts adds a node's per-minute counts, and removes the old
// ones, in one write.
func (s *Store) AddMinuteCounts(ctx context.Context, node string, counts []store.MinuteCount) error {
	if err := store.CheckMinuteCounts(node, counts); err != nil {
		return err
	}
	err := s.write(ctx, func(tx *wtx) error {
		for _, c := range counts {
			if _, err := tx.exec(`INSERT INTO flotilla_task_minutes (minute, node, kind, status, count) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (minute, node, kind, status) DO UPDATE SET count = count + excluded.count`,
				c.Minute.UnixMicro(), node, c.Kind, string(c.Status), c.Count); err != nil {
				return wrap(err, "add the counts of node %s", node)
			}
		}
		_, err := tx.exec(`DELETE FROM flotilla_task_minutes WHERE minute < ?`, tx.now.Add(-store.MinuteCountsKept).UnixMicro())
		return wrapIf(err, "remove old per-minute counts")
	})
	return requireSchema(err)
}

// MinuteCounts sums every node's counts from since on.
func (s *Store) MinuteCounts(ctx context.Context, since time.Time) ([]store.MinuteCount, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT minute, kind, status, sum(count) FROM flotilla_task_minutes
		WHERE minute >= ? GROUP BY minute, kind, status ORDER BY minute, kind, status`, since.UnixMicro())
	if err != nil {
		return nil, requireSchema(wrap(err, "read per-minute counts"))
	}
	defer rows.Close()
	out := []store.MinuteCount{}
	for rows.Next() {
		var (
			c      store.MinuteCount
			minute int64
			st     string
		)
		if err := rows.Scan(&minute, &c.Kind, &st, &c.Count); err != nil {
			return nil, wrap(err, "read per-minute counts")
		}
		c.Minute, c.Status = time.UnixMicro(minute).UTC(), task.Status(st)
		out = append(out, c)
	}
	return out, wrapIf(rows.Err(), "read per-minute counts")
}
