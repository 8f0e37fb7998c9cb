package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// pipelineHead is a pipeline's own row.
type pipelineHead struct {
	id        int64
	name, key string
	bucket    int
	createdAt time.Time
}

const (
	reservePipelineIDSQL = `SELECT nextval('flotilla_pipelines_id_seq')`
	insertPipelineSQL    = `
INSERT INTO flotilla_pipelines (id, name, key, bucket, created_at)
VALUES ($1, $2, $3, $4, statement_timestamp())
RETURNING created_at`
	lockPipelineSQL = `SELECT id, name, key, bucket, created_at FROM flotilla_pipelines WHERE id = $1 FOR UPDATE`
	getPipelineSQL  = `SELECT id, name, key, bucket, created_at FROM flotilla_pipelines WHERE id = $1`
)

// insertStepsSQL creates steps of one pipeline in input order, pending or
// queued as the caller planned them, and lists them as the pipeline's
// (flotilla_pipeline_steps).
var insertStepsSQL = `
WITH ins AS (
    INSERT INTO flotilla_tasks (kind, key, bucket, status, priority, run_at, max_attempts, timeout_ms, payload,
                                pipeline_id, step, deps_left, created_at, updated_at)
    SELECT i.kind, $1::text, $2::int, i.status, i.priority, statement_timestamp(), i.max_attempts, i.timeout_ms,
           i.payload::jsonb, $3::bigint, i.step, i.deps_left, statement_timestamp(), statement_timestamp()
    FROM unnest($4::text[], $5::text[], $6::int[], $7::int[], $8::bigint[], $9::text[], $10::text[], $11::int[])
         WITH ORDINALITY AS i(kind, status, priority, max_attempts, timeout_ms, payload, step, deps_left, ord)
    ORDER BY i.ord
    RETURNING ` + taskColumns + `
), listed AS (
    INSERT INTO flotilla_pipeline_steps (pipeline_id, task_id) SELECT $3::bigint, id FROM ins
)
SELECT ` + taskColumns + ` FROM ins ORDER BY id`

const insertDepsSQL = `
INSERT INTO flotilla_task_deps (task_id, dep_id, dep_step, on_policy, ord)
SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::int[])`

// skipNewSQL skips steps created in the same transaction whose dependency
// had already ended in a way their policy does not accept.
var skipNewSQL = `
WITH s AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS s(id, reason)
), moved AS (
    UPDATE flotilla_tasks t SET status = 'skipped', status_version = t.status_version + 1,
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM s
    WHERE t.id = s.id AND t.status = 'pending'
    RETURNING t.id, t.status_version, 'pending'::text AS old_status, t.status, $3::text AS ev_node,
              $4::bigint AS epoch, t.attempt, s.reason, ''::text AS err
)
` + eventInsertSQL("moved")

// pipelineTasksSQL reads every task of a pipeline, old tries included, in
// the order they were created: those flotilla_pipeline_steps lists, each
// by its primary key.
var pipelineTasksSQL = `SELECT ` + taskColumns + ` FROM flotilla_tasks
WHERE id = ANY(ARRAY(SELECT task_id FROM flotilla_pipeline_steps WHERE pipeline_id = $1)) AND pipeline_id = $1
ORDER BY id`

const currentDepsSQL = `
SELECT task_id, dep_step, on_policy FROM flotilla_task_deps WHERE task_id = ANY($1::bigint[]) ORDER BY task_id, ord`

// CreatePipeline creates a pipeline and its steps in one transaction.
func (s *Store) CreatePipeline(ctx context.Context, np store.NewPipeline) (store.Pipeline, error) {
	var (
		out store.Pipeline
		due bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, due, err = s.createPipeline(ctx, tx, np)
		return err
	})
	if err != nil {
		return store.Pipeline{}, err
	}
	if due {
		s.announce(ctx, []int{out.Bucket})
	}
	return out, nil
}

// CreatePipelineTx is CreatePipeline inside the caller's transaction: the
// pipeline exists, and its notification is delivered, only if and when tx
// commits. An error leaves tx to the caller, who must roll it back.
func (s *Store) CreatePipelineTx(ctx context.Context, tx pgx.Tx, np store.NewPipeline) (store.Pipeline, error) {
	out, due, err := s.createPipeline(ctx, tx, np)
	if err != nil {
		return store.Pipeline{}, err
	}
	if due {
		if _, err := tx.Exec(ctx, notifyTasksSQL, bucket.Of(out.Bucket).String()); err != nil {
			return store.Pipeline{}, wrap(err, "announce pipeline %d", out.ID)
		}
	}
	return out, nil
}

func (s *Store) createPipeline(ctx context.Context, tx pgx.Tx, np store.NewPipeline) (store.Pipeline, bool, error) {
	steps, err := store.CheckNewPipeline(np)
	if err != nil {
		return store.Pipeline{}, false, err
	}
	if err := checkStepPayloads(steps); err != nil {
		return store.Pipeline{}, false, fmt.Errorf("pipeline %q: %w", np.Name, err)
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return store.Pipeline{}, false, err
	}
	policy, err := bucket.NewPolicy(n)
	if err != nil {
		return store.Pipeline{}, false, err
	}
	h := pipelineHead{name: np.Name, key: np.Key}
	if err := tx.QueryRow(ctx, reservePipelineIDSQL).Scan(&h.id); err != nil {
		return store.Pipeline{}, false, wrap(err, "create pipeline %q", np.Name)
	}
	if h.key == "" {
		h.key = np.Name + "-" + strconv.FormatInt(h.id, 10)
	}
	h.bucket = policy.Of(h.key)
	if err := tx.QueryRow(ctx, insertPipelineSQL, h.id, h.name, h.key, h.bucket).Scan(&h.createdAt); err != nil {
		return store.Pipeline{}, false, wrap(err, "create pipeline %q", np.Name)
	}
	due, err := createSteps(ctx, tx, h, steps, nil, nil, "", 0)
	if err != nil {
		return store.Pipeline{}, false, err
	}
	p, err := loadPipeline(ctx, tx, h)
	return p, due, err
}

func checkStepPayloads(steps []task.Step) error {
	for _, st := range steps {
		if !validJSON(st.Payload) {
			return fmt.Errorf("step %q: payload is not valid JSON: %w", st.Name, store.ErrInvalid)
		}
	}
	return nil
}

// createSteps creates steps (in CheckSteps order) of pipeline h inside tx,
// as store.PlanBirths decides. current maps the names of steps outside
// steps to the tasks their dependents will depend on, and status says how
// those ended (or that they have not): the caller has locked the rows of
// those not ended, so that none ends unseen before tx commits. node and
// epoch are recorded on the skips it makes. It reports whether a step was
// queued.
func createSteps(ctx context.Context, tx pgx.Tx, h pipelineHead, steps []task.Step,
	current map[string]int64, status map[string]task.Status, node string, epoch int64) (bool, error) {
	births := store.PlanBirths(steps, func(name string) task.Status { return status[name] })
	n := len(steps)
	var (
		kinds, statuses, payloads, names = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		priorities, maxAttempts, left    = make([]int32, n), make([]int32, n), make([]int32, n)
		timeouts                         = make([]int64, n)
	)
	due := false
	for i, st := range steps {
		kinds[i], payloads[i], names[i] = st.Kind, jsonOrNull(st.Payload), st.Name
		statuses[i] = string(task.Pending)
		if births[i].Status == task.Queued {
			statuses[i] = string(task.Queued)
			due = true
		}
		priorities[i], left[i] = int32(st.Priority), int32(births[i].DepsLeft)
		maxAttempts[i] = int32(maxAttemptsOf(store.NewTask{MaxAttempts: st.MaxAttempts}))
		timeouts[i] = st.Timeout.Milliseconds()
	}
	rows, err := tx.Query(ctx, insertStepsSQL, h.key, h.bucket, h.id, kinds, statuses, priorities, maxAttempts,
		timeouts, payloads, names, left)
	if err != nil {
		return false, createError(err, n)
	}
	created, err := scanTasks(rows)
	if err != nil {
		return false, createError(err, n)
	}
	if len(created) != n {
		return false, fmt.Errorf("create %d steps: %d were returned", n, len(created))
	}
	ids := make(map[string]int64, len(current)+n)
	for name, id := range current {
		ids[name] = id
	}
	var (
		depTask, depID, depOrd []int64
		depStep, depOn         []string
		skipIDs                []int64
		skipWhy                []string
	)
	for i, st := range steps {
		ids[st.Name] = created[i].ID
		for j, d := range st.DependsOn {
			depTask, depID, depOrd = append(depTask, created[i].ID), append(depID, ids[d.Step]), append(depOrd, int64(j))
			depStep, depOn = append(depStep, d.Step), append(depOn, d.Policy())
		}
		if births[i].Status == task.Skipped {
			skipIDs, skipWhy = append(skipIDs, created[i].ID), append(skipWhy, births[i].SkipReason)
		}
	}
	ords := make([]int32, len(depOrd))
	for i, o := range depOrd {
		ords[i] = int32(o)
	}
	if len(depTask) > 0 {
		if _, err := tx.Exec(ctx, insertDepsSQL, depTask, depID, depStep, depOn, ords); err != nil {
			return false, wrap(err, "record the dependencies of %d steps", n)
		}
	}
	if len(skipIDs) > 0 {
		if _, err := tx.Exec(ctx, skipNewSQL, skipIDs, skipWhy, node, epoch); err != nil {
			return false, wrap(err, "skip %d steps", len(skipIDs))
		}
	}
	return due, nil
}

// GetPipeline reads a pipeline and its tasks in one snapshot.
func (s *Store) GetPipeline(ctx context.Context, id int64) (store.Pipeline, error) {
	var out store.Pipeline
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			h, err := readPipelineHead(ctx, tx, getPipelineSQL, id)
			if err != nil {
				return err
			}
			out, err = loadPipeline(ctx, tx, h)
			return err
		})
	return out, err
}

func readPipelineHead(ctx context.Context, q querier, sql string, id int64) (pipelineHead, error) {
	h := pipelineHead{}
	var b int32
	if err := q.QueryRow(ctx, sql, id).Scan(&h.id, &h.name, &h.key, &b, &h.createdAt); err != nil {
		return pipelineHead{}, wrap(err, "pipeline %d", id)
	}
	h.bucket, h.createdAt = int(b), h.createdAt.UTC()
	return h, nil
}

// loadPipeline reads the tasks of pipeline h and the dependencies of each
// step's current task.
func loadPipeline(ctx context.Context, q querier, h pipelineHead) (store.Pipeline, error) {
	p := store.Pipeline{ID: h.id, Name: h.name, Key: h.key, Bucket: h.bucket, CreatedAt: h.createdAt}
	rows, err := q.Query(ctx, pipelineTasksSQL, h.id)
	if err != nil {
		return store.Pipeline{}, wrap(err, "tasks of pipeline %d", h.id)
	}
	tasks, err := scanTasks(rows)
	if err != nil {
		return store.Pipeline{}, wrap(err, "tasks of pipeline %d", h.id)
	}
	index := map[string]int{}
	for _, t := range tasks {
		i, ok := index[t.Step]
		if !ok {
			i = len(p.Steps)
			index[t.Step] = i
			p.Steps = append(p.Steps, store.PipelineStep{Name: t.Step})
		}
		p.Steps[i].Task = t // ascending ids: the last is current
		p.Steps[i].Tries++
	}
	ids := make([]int64, len(p.Steps))
	byTask := make(map[int64]int, len(p.Steps))
	for i, st := range p.Steps {
		ids[i], byTask[st.Task.ID] = st.Task.ID, i
	}
	deps, err := q.Query(ctx, currentDepsSQL, ids)
	if err != nil {
		return store.Pipeline{}, wrap(err, "dependencies of pipeline %d", h.id)
	}
	defer deps.Close()
	for deps.Next() {
		var (
			id       int64
			step, on string
		)
		if err := deps.Scan(&id, &step, &on); err != nil {
			return store.Pipeline{}, wrap(err, "dependencies of pipeline %d", h.id)
		}
		i := byTask[id]
		p.Steps[i].DependsOn = append(p.Steps[i].DependsOn, task.Dependency{Step: step, On: on})
	}
	if err := deps.Err(); err != nil {
		return store.Pipeline{}, wrap(err, "dependencies of pipeline %d", h.id)
	}
	return p, nil
}

const dependencyResultsSQL = `
SELECT d.dep_step, r.result
FROM flotilla_tasks x
LEFT JOIN flotilla_task_deps d ON d.task_id = x.id
LEFT JOIN flotilla_tasks r ON r.id = d.dep_id
WHERE x.id = $1`

// dependencyResultsSizeSQL sums the dependencies' results as JSON text,
// without sending them.
const dependencyResultsSizeSQL = `
SELECT coalesce(sum(octet_length(r.result::text)), 0)
FROM flotilla_task_deps d
JOIN flotilla_tasks r ON r.id = d.dep_id
WHERE d.task_id = $1`

// DependencyResults reads the results of a task's dependencies, once their
// size in all is known to be within max.
func (s *Store) DependencyResults(ctx context.Context, id int64, max int64) (map[string]json.RawMessage, error) {
	var size int64
	if err := s.pool.QueryRow(ctx, dependencyResultsSizeSQL, id).Scan(&size); err != nil {
		return nil, wrap(err, "dependency results of task %d", id)
	}
	if size > max {
		return nil, &store.DependencyResultsTooLargeError{Task: id, Bytes: size, Max: max}
	}
	rows, err := s.pool.Query(ctx, dependencyResultsSQL, id)
	if err != nil {
		return nil, wrap(err, "dependency results of task %d", id)
	}
	defer rows.Close()
	found := false
	out := map[string]json.RawMessage{}
	for rows.Next() {
		var (
			step   pgtype.Text
			result []byte
		)
		if err := rows.Scan(&step, &result); err != nil {
			return nil, wrap(err, "dependency results of task %d", id)
		}
		found = true
		if step.Valid {
			out[step.String] = rawJSON(result)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "dependency results of task %d", id)
	}
	if !found {
		return nil, fmt.Errorf("dependency results of task %d: %w", id, store.ErrNotFound)
	}
	return out, nil
}

// RetryPipeline runs a step and its unsucceeded descendants again, in one
// transaction that holds the pipeline's row, so that two retries or a
// retry and an append of one pipeline are made one after the other.
func (s *Store) RetryPipeline(ctx context.Context, id int64, from string) (store.Pipeline, error) {
	var (
		out store.Pipeline
		due bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		h, err := readPipelineHead(ctx, tx, lockPipelineSQL, id)
		if err != nil {
			return err
		}
		p, err := loadPipeline(ctx, tx, h)
		if err != nil {
			return err
		}
		out, _, due, err = retryFrom(ctx, tx, h, p, from)
		return err
	})
	if err != nil {
		return store.Pipeline{}, err
	}
	if due {
		s.announce(ctx, []int{out.Bucket})
	}
	return out, nil
}

// retryFrom runs the step from of p (read in tx, whose pipeline row tx
// holds) again with its unsucceeded descendants, as new tasks, and answers
// the pipeline after, the steps run again and whether a new task is due:
// RetryPipeline and RetryTask alike.
func retryFrom(ctx context.Context, tx pgx.Tx, h pipelineHead, p store.Pipeline, from string) (store.Pipeline, []string, bool, error) {
	names, err := store.RetryPlan(p, from)
	if err != nil {
		return store.Pipeline{}, nil, false, err
	}
	steps := store.RetrySteps(p, names)
	again := map[string]bool{}
	for _, n := range names {
		again[n] = true
	}
	current := map[string]int64{}
	var open []int64
	for _, st := range p.Steps {
		if !again[st.Name] {
			current[st.Name] = st.Task.ID
			if !st.Task.Status.Terminal() {
				open = append(open, st.Task.ID)
			}
		}
	}
	status, err := lockedStatuses(ctx, tx, p, open)
	if err != nil {
		return store.Pipeline{}, nil, false, err
	}
	due, err := createSteps(ctx, tx, h, steps, current, status, "", 0)
	if err != nil {
		return store.Pipeline{}, nil, false, err
	}
	after, err := loadPipeline(ctx, tx, h)
	return after, names, due, err
}

const lockStatusesSQL = `SELECT id, status FROM flotilla_tasks WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE`

// lockedStatuses returns the status of the current task of each step of p,
// after locking the rows of open (tasks not ended when p was read), in id
// order, and reading them again: a dependency ended since is seen as ended,
// and one not ended cannot end before the caller's transaction does.
func lockedStatuses(ctx context.Context, tx pgx.Tx, p store.Pipeline, open []int64) (map[string]task.Status, error) {
	status := map[string]task.Status{}
	for _, st := range p.Steps {
		status[st.Name] = st.Task.Status
	}
	if len(open) == 0 {
		return status, nil
	}
	slices.Sort(open)
	rows, err := tx.Query(ctx, lockStatusesSQL, open)
	if err != nil {
		return nil, wrap(err, "lock %d tasks of pipeline %d", len(open), p.ID)
	}
	defer rows.Close()
	now := map[int64]task.Status{}
	for rows.Next() {
		var (
			id int64
			st string
		)
		if err := rows.Scan(&id, &st); err != nil {
			return nil, wrap(err, "lock %d tasks of pipeline %d", len(open), p.ID)
		}
		now[id] = task.Status(st)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "lock %d tasks of pipeline %d", len(open), p.ID)
	}
	for _, st := range p.Steps {
		if s, ok := now[st.Task.ID]; ok {
			status[st.Name] = s
		}
	}
	return status, nil
}

// appendersSQL reads the pipeline and step of tasks whose attempts append.
const appendersSQL = `SELECT id, pipeline_id, step FROM flotilla_tasks WHERE id = ANY($1::bigint[])`

// advanceAppending is advance for a batch in which some attempts append
// steps: one transaction that locks the pipelines appended to (in id order,
// before any task row, as RetryPipeline does), checks each append, applies
// the batch with the same statements as advance, and creates the steps of
// each attempt whose move ended its task. An append that CheckAppend
// refuses turns its attempt's move into a failure saying why.
func (s *Store) advanceAppending(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	batch = slices.Clone(batch)
	var (
		out []store.Outcome
		due []int
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ids []int64
		for _, at := range batch {
			if len(at.Append) > 0 {
				ids = append(ids, at.Ref.ID)
			}
		}
		type appender struct {
			pipeline int64
			step     string
		}
		appenders := map[int64]appender{}
		rows, err := tx.Query(ctx, appendersSQL, ids)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				id       int64
				pipeline pgtype.Int8
				step     pgtype.Text
			)
			if err := rows.Scan(&id, &pipeline, &step); err != nil {
				rows.Close()
				return err
			}
			appenders[id] = appender{pipeline.Int64, step.String}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var pipelineIDs []int64
		for _, a := range appenders {
			if a.pipeline != 0 && !slices.Contains(pipelineIDs, a.pipeline) {
				pipelineIDs = append(pipelineIDs, a.pipeline)
			}
		}
		slices.Sort(pipelineIDs)
		heads := map[int64]pipelineHead{}
		pipelines := map[int64]store.Pipeline{}
		for _, pid := range pipelineIDs {
			h, err := readPipelineHead(ctx, tx, lockPipelineSQL, pid)
			if err != nil {
				return err
			}
			p, err := loadPipeline(ctx, tx, h)
			if err != nil {
				return err
			}
			heads[pid], pipelines[pid] = h, p
		}
		appended := make([][]task.Step, len(batch))
		for i := range batch {
			at := &batch[i]
			if len(at.Append) == 0 {
				continue
			}
			a, ok := appenders[at.Ref.ID]
			if !ok {
				continue // no such task: the advance answers ErrNotFound
			}
			var err error
			if a.pipeline == 0 {
				err = fmt.Errorf("appending steps: task %d is not a step of a pipeline: %w", at.Ref.ID, store.ErrInvalid)
			} else {
				p := pipelines[a.pipeline]
				appended[i], err = store.CheckAppend(a.step, at.Append, func(name string) bool {
					_, taken := p.Step(name)
					return taken
				})
				if err == nil {
					err = checkStepPayloads(appended[i])
				}
				if err != nil {
					err = fmt.Errorf("appending steps to pipeline %d: %w", p.ID, err)
				}
			}
			if err != nil && at.To.Terminal() {
				appended[i] = nil
				at.To, at.Reason, at.Error = task.Failed, "appending steps refused", err.Error()
			}
			at.Append = nil
		}
		b := &pgx.Batch{}
		b.Queue("SELECT") // stands for BEGIN, which pgx.BeginFunc has sent
		queueAdvance(b, owner, batch)
		br := tx.SendBatch(ctx, b)
		out, due, err = readAdvance(br, owner, batch)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		for i, steps := range appended {
			o := out[i]
			if len(steps) == 0 || o.Err != nil || !o.Status.Terminal() {
				continue
			}
			a := appenders[batch[i].Ref.ID]
			status := map[string]task.Status{a.step: o.Status}
			current := map[string]int64{a.step: batch[i].Ref.ID}
			queued, err := createSteps(ctx, tx, heads[a.pipeline], steps, current, status, batch[i].Node, 0)
			if err != nil {
				return err
			}
			if queued {
				due = append(due, heads[a.pipeline].bucket)
			}
			// A second append of the same pipeline in this batch must not
			// take these names either.
			p := pipelines[a.pipeline]
			for _, st := range steps {
				p.Steps = append(p.Steps, store.PipelineStep{Name: st.Name})
			}
			pipelines[a.pipeline] = p
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrInvalid) {
			return nil, err
		}
		return nil, wrap(err, "advance %d tasks", len(batch))
	}
	s.announce(ctx, due)
	return out, nil
}
