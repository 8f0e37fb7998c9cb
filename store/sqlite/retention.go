package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// prunableSQL is store.Retention.Prunable for the task row alias a, with
// the retention as the table rules and the database clock as ?2. Never
// NULL, so that NOT prunableSQL is true for every row it is not.
func prunableSQL(a string) string {
	age := `coalesce((SELECT r.age FROM rules r WHERE r.kind = ` + a + `.kind AND r.status = ` + a + `.status),
                      (SELECT r.age FROM rules r WHERE r.kind = '' AND r.status = ` + a + `.status), 0)`
	return `coalesce(` + a + `.status IN ` + terminalStatusesSQL + `
        AND ` + age + ` > 0
        AND ` + a + `.finished_at <= ?2 - ` + age + `
        AND NOT EXISTS (SELECT 1 FROM flotilla_commands c WHERE c.task_id = ` + a + `.id AND c.acked_at IS NULL), 0)`
}

// prunableSQLQuery selects the prunable tasks of bucket ?1 at ?2, oldest
// first, at most ?3 (-1: all), walking flotilla_tasks_finished_idx per
// final state up to that state's smallest age. ?4 is the retention as JSON
// [[kind, state, age µs], ...], ?5 the states scanned as [[state, min age
// µs], ...]. A pipeline's task qualifies only when every task of its
// pipeline does.
var prunableSQLQuery = `
WITH rules(kind, status, age) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(?4)
), scan(status, min_age) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?5)
)
SELECT t.id, t.status, t.finished_at, t.pipeline_id
FROM scan s JOIN flotilla_tasks t ON t.bucket = ?1 AND t.status = s.status AND t.finished_at <= ?2 - s.min_age
WHERE ` + prunableSQL("t") + `
  AND (t.pipeline_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM flotilla_tasks p WHERE p.pipeline_id = t.pipeline_id AND NOT ` + prunableSQL("p") + `))
ORDER BY t.finished_at, t.id
LIMIT ?3`

var terminalStatusesSQL = func() string {
	quoted := []string{}
	for _, st := range task.TerminalStates() {
		quoted = append(quoted, "'"+string(st)+"'")
	}
	return "(" + strings.Join(quoted, ", ") + ")"
}()

type pruneVictim struct {
	id       int64
	status   task.Status
	finished int64
	pipeline sql.NullInt64
}

// PruneFinished removes up to req.Limit tasks of a held bucket that have
// outlived their retention, in one write of the writer: the file's write
// lock serialises it with every claim, for as long as one batch takes.
func (s *Store) PruneFinished(ctx context.Context, req store.PruneRequest) (store.PruneResult, error) {
	if err := store.CheckPrune(&req); err != nil {
		return store.PruneResult{}, err
	}
	if err := s.checkBuckets(ctx, bucket.Of(req.Bucket)); err != nil {
		return store.PruneResult{}, err
	}
	var out store.PruneResult
	minAges := req.Retention.MinAges()
	if len(minAges) == 0 {
		return out, nil
	}
	var rules, scan [][]any
	for _, r := range req.Retention.Rules() {
		rules = append(rules, []any{r.Kind, string(r.Status), r.Age.Microseconds()})
	}
	for _, st := range task.TerminalStates() {
		if age, ok := minAges[st]; ok {
			scan = append(scan, []any{string(st), age.Microseconds()})
		}
	}
	rulesJSON, _ := json.Marshal(rules)
	scanJSON, _ := json.Marshal(scan)

	if req.DryRun {
		now, err := s.Now(ctx)
		if err != nil {
			return out, err
		}
		rows, err := s.rdb.QueryContext(ctx, prunableSQLQuery, req.Bucket, now.UnixMicro(), -1, string(rulesJSON), string(scanJSON))
		if err != nil {
			return out, requireSchema(wrap(err, "count prunable tasks of bucket %d", req.Bucket))
		}
		victims, err := scanVictims(rows)
		for _, v := range victims {
			out.Add(v.status, fromMicros(sql.NullInt64{Int64: v.finished, Valid: true}))
		}
		return out, wrapIf(err, "count prunable tasks")
	}

	err := s.write(ctx, func(tx *wtx) error {
		out = store.PruneResult{}
		live, err := leaseLiveFor(tx, req.Bucket, req.Owner, req.Epoch)
		if err != nil {
			return err
		}
		if !live {
			return fmt.Errorf("prune bucket %d: %s does not hold it under epoch %d: %w",
				req.Bucket, req.Owner, req.Epoch, store.ErrFenced)
		}
		rows, err := tx.query(prunableSQLQuery, req.Bucket, tx.now.UnixMicro(), req.Limit, string(rulesJSON), string(scanJSON))
		if err != nil {
			return wrap(err, "find prunable tasks of bucket %d", req.Bucket)
		}
		victims, err := scanVictims(rows)
		if err != nil || len(victims) == 0 {
			return wrapIf(err, "find prunable tasks")
		}
		ids := make([]int64, len(victims))
		var pipelines []int64
		for i, v := range victims {
			ids[i] = v.id
			if v.pipeline.Valid {
				pipelines = append(pipelines, v.pipeline.Int64)
			}
			out.Add(v.status, fromMicros(sql.NullInt64{Int64: v.finished, Valid: true}))
		}
		idsJSON, _ := json.Marshal(ids)
		pipelinesJSON, _ := json.Marshal(pipelines)
		count := func(what, q string, args ...any) (int, error) {
			res, err := tx.exec(q, args...)
			if err != nil {
				return 0, wrap(err, "prune the %s of bucket %d", what, req.Bucket)
			}
			n, err := res.RowsAffected()
			return int(n), wrapIf(err, "prune")
		}
		if out.Events, err = count("events", `DELETE FROM flotilla_task_events WHERE task_id IN (SELECT value FROM json_each(?))`, string(idsJSON)); err != nil {
			return err
		}
		if out.Commands, err = count("commands", `DELETE FROM flotilla_commands WHERE task_id IN (SELECT value FROM json_each(?))`, string(idsJSON)); err != nil {
			return err
		}
		if _, err = count("dependencies", `DELETE FROM flotilla_task_deps WHERE task_id IN (SELECT value FROM json_each(?))`, string(idsJSON)); err != nil {
			return err
		}
		if _, err = count("retry links", `DELETE FROM flotilla_task_retries
  WHERE task_id IN (SELECT value FROM json_each(?1)) OR retry_id IN (SELECT value FROM json_each(?1))`, string(idsJSON)); err != nil {
			return err
		}
		if _, err = count("tasks", `DELETE FROM flotilla_tasks WHERE id IN (SELECT value FROM json_each(?))`, string(idsJSON)); err != nil {
			return err
		}
		// A pipeline's row goes with the first batch that removes a task
		// of it, not its last: reads find a pipeline by its row, so a
		// pipeline larger than a batch is whole or gone to them, never
		// partial (a retry planned against a removed step would wait for
		// it forever). Its remaining tasks, every one prunable, go in the
		// next batches; one batch per pipeline would be unbounded.
		if len(pipelines) > 0 {
			_, err = count("pipelines", `DELETE FROM flotilla_pipelines WHERE id IN (SELECT value FROM json_each(?))`,
				string(pipelinesJSON))
		}
		return err
	})
	if err != nil {
		return store.PruneResult{}, requireSchema(err)
	}
	return out, nil
}

func scanVictims(rows *sql.Rows) ([]pruneVictim, error) {
	defer rows.Close()
	var out []pruneVictim
	for rows.Next() {
		var v pruneVictim
		var st string
		if err := rows.Scan(&v.id, &st, &v.finished, &v.pipeline); err != nil {
			return nil, err
		}
		v.status = task.Status(st)
		out = append(out, v)
	}
	return out, rows.Err()
}
