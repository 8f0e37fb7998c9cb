package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// retentionRulesSQL is the retention as a table: $4 kinds ("" for the
// fleet's age), $5 states, $6 ages in milliseconds (0 keeps forever).
const retentionRulesSQL = `rules AS (
    SELECT * FROM unnest($4::text[], $5::text[], $6::bigint[]) AS r(kind, status, age_ms)
)`

// prunableSQL is store.Retention.Prunable for the task row alias a: final,
// its kind's age (or the fleet's) above 0 and passed, and no
// unacknowledged command naming it (flotilla_commands_pending_idx). Never
// NULL, so that NOT prunableSQL is true for every row it is not.
func prunableSQL(a string) string {
	age := `coalesce((SELECT r.age_ms FROM rules r WHERE r.kind = ` + a + `.kind AND r.status = ` + a + `.status),
                      (SELECT r.age_ms FROM rules r WHERE r.kind = '' AND r.status = ` + a + `.status), 0)`
	return `coalesce(` + a + `.status IN ` + terminalStatusesSQL + `
        AND ` + age + ` > 0
        AND ` + a + `.finished_at <= statement_timestamp() - ` + age + ` * interval '1 millisecond'
        AND NOT EXISTS (SELECT 1 FROM flotilla_commands c WHERE c.task_id = ` + a + `.id AND c.acked_at IS NULL), false)`
}

// prunableTasksSQL selects the prunable tasks of bucket $1, walking
// flotilla_tasks_finished_idx per final state ($7) from the oldest end up
// to the state's smallest age ($8, in milliseconds), at most $9 per state.
// A pipeline's task qualifies only when every task of its pipeline does
// (listed in flotilla_pipeline_steps; all of them live in the same
// bucket).
// lock is appended to the per-state scan.
func prunableTasksSQL(lock string) string {
	return `SELECT v.id, v.status, v.finished_at, v.pipeline_id
    FROM unnest($7::text[], $8::bigint[]) AS s(status, min_age_ms)
    CROSS JOIN LATERAL (
        SELECT t.id, t.status, t.finished_at, t.pipeline_id
        FROM flotilla_tasks t
        -- The literal list lets the planner prove the partial index's
        -- predicate, which s.status, a value known only at run time,
        -- cannot.
        WHERE t.bucket = $1::int AND t.status = s.status AND t.status IN ` + terminalStatusesSQL + `
          AND t.finished_at <= statement_timestamp() - s.min_age_ms * interval '1 millisecond'
          AND ` + prunableSQL("t") + `
          AND (t.pipeline_id IS NULL OR NOT EXISTS (
                SELECT 1 FROM flotilla_pipeline_steps ps
                JOIN flotilla_tasks p ON p.id = ps.task_id
                WHERE ps.pipeline_id = t.pipeline_id AND NOT ` + prunableSQL("p") + `))
        ORDER BY t.finished_at
        LIMIT $9
        ` + lock + `
    ) v`
}

// pruneSQL removes up to $9 prunable tasks of bucket $1, oldest first, with
// their events, commands, dependency rows, retry links and pipeline
// listings, and the row of each pipeline a task of which goes. It removes
// nothing unless $2 holds the bucket under epoch $3, unexpired: the lease
// test is a one-time filter over the whole scan.
//
// A pipeline's row goes with the first batch that removes a task of it,
// not its last: every read of a pipeline (GetPipeline, a retry, an append,
// the list) starts from its row, so a pipeline larger than a batch is
// whole or gone to them, never partial, and a retry is never planned
// against a step whose task is gone (it would wait for it forever). Its
// remaining tasks, every one of them prunable, go in the next batches, as
// tasks of no pipeline; removing a pipeline in one batch would make a
// batch as large as a pipeline (100,000 steps and their retries).
//
// It locks only finished rows and their pipelines' rows, and skips those
// another transaction holds (an operator's, a concurrent prune's during a
// hand-over, a retry's holding its pipeline, whose tasks then wait for a
// later batch), so it never waits for nor holds up a claim, which locks
// claimable rows only, nor a retry.
var pruneSQL = `
WITH lease AS (
    SELECT 1 FROM flotilla_bucket_leases l
    WHERE l.bucket = $1::int AND l.owner = $2::text AND l.epoch = $3::bigint
      AND l.expires_at > statement_timestamp()
), ` + retentionRulesSQL + `, candidates AS (
    ` + prunableTasksSQL("FOR UPDATE OF t SKIP LOCKED") + `
    WHERE EXISTS (SELECT 1 FROM lease)
    ORDER BY v.finished_at
    LIMIT $9
), heads AS (
    -- The rows of the candidates' pipelines, locked for their removal;
    -- one another transaction holds (a retry or an append planning
    -- against the pipeline) is skipped with its pipeline's tasks, which a
    -- later batch takes.
    SELECT pl.id FROM flotilla_pipelines pl
    WHERE pl.id = ANY(ARRAY(SELECT DISTINCT pipeline_id FROM candidates WHERE pipeline_id IS NOT NULL))
    FOR UPDATE SKIP LOCKED
), victims AS (
    -- A candidate of no pipeline, of a pipeline whose row heads locked,
    -- or of one whose row an earlier batch removed. Arrays again, each
    -- computed once, so that no join hashes the pipelines table.
    SELECT c.* FROM candidates c
    WHERE c.pipeline_id IS NULL
       OR c.pipeline_id = ANY(ARRAY(SELECT id FROM heads))
       OR c.pipeline_id <> ALL(ARRAY(
            SELECT pl.id FROM flotilla_pipelines pl
            WHERE pl.id = ANY(ARRAY(SELECT DISTINCT pipeline_id FROM candidates WHERE pipeline_id IS NOT NULL))))
), ids AS (
    -- The victims as an array: each delete below is then an index lookup
    -- per id, where a join to the CTE would be planned as a hash join over
    -- a whole table.
    SELECT ARRAY(SELECT id FROM victims) AS ids,
           ARRAY(SELECT DISTINCT pipeline_id FROM victims WHERE pipeline_id IS NOT NULL) AS pipelines
), gone_events AS (
    DELETE FROM flotilla_task_events e WHERE e.task_id = ANY((SELECT ids FROM ids)::bigint[]) RETURNING 1
), gone_commands AS (
    DELETE FROM flotilla_commands c WHERE c.task_id = ANY((SELECT ids FROM ids)::bigint[]) RETURNING 1
), gone_deps AS (
    DELETE FROM flotilla_task_deps d WHERE d.task_id = ANY((SELECT ids FROM ids)::bigint[])
), gone_retries AS (
    DELETE FROM flotilla_task_retries r
    WHERE r.task_id = ANY((SELECT ids FROM ids)::bigint[]) OR r.retry_id = ANY((SELECT ids FROM ids)::bigint[])
), gone_steps AS (
    DELETE FROM flotilla_pipeline_steps ps
    WHERE ps.pipeline_id = ANY((SELECT pipelines FROM ids)::bigint[])
      AND ps.task_id = ANY((SELECT ids FROM ids)::bigint[])
), gone_tasks AS (
    DELETE FROM flotilla_tasks t WHERE t.id = ANY((SELECT ids FROM ids)::bigint[]) RETURNING t.status, t.finished_at
), gone_pipelines AS (
    DELETE FROM flotilla_pipelines pl WHERE pl.id = ANY((SELECT pipelines FROM ids)::bigint[])
)
SELECT EXISTS (SELECT 1 FROM lease), g.status, coalesce(g.n, 0), g.oldest,
       (SELECT count(*) FROM gone_events), (SELECT count(*) FROM gone_commands)
FROM (SELECT 1) one
LEFT JOIN (SELECT status, count(*) AS n, min(finished_at) AS oldest FROM gone_tasks GROUP BY status) g ON true`

// pruneDrySQL counts what pruneSQL would remove from bucket $1, with no
// lease, no lock and no limit ($9, the per-state scan's, is NULL). The
// lease's parameters are named only so that they have a type.
var pruneDrySQL = `
WITH unused AS (SELECT $2::text, $3::bigint), ` + retentionRulesSQL + `
SELECT v.status, count(*), min(v.finished_at)
FROM (` + prunableTasksSQL("") + `) v
GROUP BY v.status`

// pruneSettingSQL turns JIT compilation off for the prune's transaction:
// the statement's estimated cost grows with the table, and past
// jit_above_cost PostgreSQL spent seconds compiling it (measured: 4.2 s of
// JIT for a 40 ms statement on 60,000 finished rows).
const pruneSettingSQL = `SELECT set_config('jit', 'off', true)`

// readPrune reads the prune's batch: BEGIN, its setting, the prune, COMMIT.
func readPrune(br pgx.BatchResults, out *store.PruneResult, held *bool) error {
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var st *string
	var n int
	var oldest *time.Time
	var events, commands int
	if _, err := pgx.ForEachRow(rows, []any{held, &st, &n, &oldest, &events, &commands}, func() error {
		if st != nil && oldest != nil {
			out.AddMany(task.Status(*st), n, *oldest)
		}
		out.Events, out.Commands = events, commands
		return nil
	}); err != nil {
		return err
	}
	_, err = br.Exec()
	return err
}

// PruneFinished removes up to req.Limit tasks of a held bucket that have
// outlived their retention.
func (s *Store) PruneFinished(ctx context.Context, req store.PruneRequest) (store.PruneResult, error) {
	if err := store.CheckPrune(&req); err != nil {
		return store.PruneResult{}, err
	}
	var out store.PruneResult
	minAges := req.Retention.MinAges()
	if len(minAges) == 0 {
		return out, nil // keeps everything: nothing to read
	}
	var kinds, statuses []string
	var ages []int64
	for _, r := range req.Retention.Rules() {
		kinds = append(kinds, r.Kind)
		statuses = append(statuses, string(r.Status))
		ages = append(ages, r.Age.Milliseconds())
	}
	var scanStates []string
	var scanAges []int64
	for _, st := range task.TerminalStates() {
		if age, ok := minAges[st]; ok {
			scanStates = append(scanStates, string(st))
			scanAges = append(scanAges, age.Milliseconds())
		}
	}
	if req.DryRun {
		rows, err := s.pool.Query(ctx, pruneDrySQL, req.Bucket, nil, nil, kinds, statuses, ages,
			scanStates, scanAges, nil)
		if err != nil {
			return out, wrap(err, "count prunable tasks of bucket %d", req.Bucket)
		}
		var st string
		var n int
		var oldest time.Time
		_, err = pgx.ForEachRow(rows, []any{&st, &n, &oldest}, func() error {
			out.AddMany(task.Status(st), n, oldest)
			return nil
		})
		return out, wrap(err, "count prunable tasks of bucket %d", req.Bucket)
	}

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(pruneSettingSQL)
	b.Queue(pruneSQL, req.Bucket, req.Owner, req.Epoch, kinds, statuses, ages, scanStates, scanAges, req.Limit)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	held := false
	err := readPrune(br, &out, &held)
	// On an error the connection is left in a failed transaction, and the
	// pool closes it rather than reuse it.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.PruneResult{}, wrap(err, "prune bucket %d", req.Bucket)
	}
	if !held {
		return store.PruneResult{}, fmt.Errorf("prune bucket %d: %s does not hold it under epoch %d: %w",
			req.Bucket, req.Owner, req.Epoch, store.ErrFenced)
	}
	return out, nil
}
