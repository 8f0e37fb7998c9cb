package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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

func pipelineNotFound(id int64) error {
	return fmt.Errorf("pipeline %d: %w", id, store.ErrNotFound)
}

const pipelineHeadSQL = `SELECT id, name, key, bucket, created_at FROM flotilla_pipelines WHERE id = ?`

func readPipelineHead(ctx context.Context, q querier, id int64) (pipelineHead, error) {
	var (
		h       pipelineHead
		created int64
	)
	err := q.QueryRowContext(ctx, pipelineHeadSQL, id).Scan(&h.id, &h.name, &h.key, &h.bucket, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return pipelineHead{}, pipelineNotFound(id)
	}
	if err != nil {
		return pipelineHead{}, requireSchema(wrap(err, "pipeline %d", id))
	}
	h.createdAt = time.UnixMicro(created).UTC()
	return h, nil
}

// CreatePipeline creates a pipeline and its steps in one write.
func (s *Store) CreatePipeline(ctx context.Context, np store.NewPipeline) (store.Pipeline, error) {
	steps, policy, err := s.checkPipeline(ctx, np)
	if err != nil {
		return store.Pipeline{}, err
	}
	var out store.Pipeline
	err = s.write(ctx, func(tx *wtx) error {
		var err error
		out, err = createPipeline(tx, np, steps, policy)
		return err
	})
	if err != nil {
		return store.Pipeline{}, requireSchema(err)
	}
	return out, nil
}

// CreatePipelineInTx is CreatePipeline inside the caller's transaction:
// tx must be a *sql.Tx on this store's file (see CreateTasksInTx). The
// pipeline exists, and nodes hear of its first steps, only if tx commits.
func (s *Store) CreatePipelineInTx(ctx context.Context, tx any, np store.NewPipeline) (store.Pipeline, error) {
	stx, err := callersTx(tx, "pipelines")
	if err != nil {
		return store.Pipeline{}, err
	}
	steps, policy, err := s.checkPipeline(ctx, np)
	if err != nil {
		return store.Pipeline{}, err
	}
	var out store.Pipeline
	err = s.inCallersTx(ctx, stx, func(w *wtx) error {
		var err error
		out, err = createPipeline(w, np, steps, policy)
		return err
	})
	if err != nil {
		return store.Pipeline{}, requireSchema(err)
	}
	return out, nil
}

// checkPipeline validates a new pipeline before anything is written, and
// returns its steps in creation order with the fleet's bucket policy.
func (s *Store) checkPipeline(ctx context.Context, np store.NewPipeline) ([]task.Step, bucket.Policy, error) {
	steps, err := store.CheckNewPipeline(np)
	if err != nil {
		return nil, bucket.Policy{}, err
	}
	if err := checkStepPayloads(steps); err != nil {
		return nil, bucket.Policy{}, fmt.Errorf("pipeline %q: %w", np.Name, err)
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return nil, bucket.Policy{}, err
	}
	policy, err := bucket.NewPolicy(n)
	if err != nil {
		return nil, bucket.Policy{}, err
	}
	return steps, policy, nil
}

// createPipeline writes a checked pipeline and its steps in tx.
func createPipeline(tx *wtx, np store.NewPipeline, steps []task.Step, policy bucket.Policy) (store.Pipeline, error) {
	h := pipelineHead{name: np.Name, key: np.Key, createdAt: tx.now}
	// The default key names the pipeline's id, which the insert hands
	// out: the row is written first and keyed after, under the same write
	// lock.
	if err := tx.queryRow(`INSERT INTO flotilla_pipelines (name, key, bucket, created_at) VALUES (?, '', 0, ?) RETURNING id`,
		h.name, tx.now.UnixMicro()).Scan(&h.id); err != nil {
		return store.Pipeline{}, wrap(err, "create pipeline %q", np.Name)
	}
	if h.key == "" {
		h.key = np.Name + "-" + strconv.FormatInt(h.id, 10)
	}
	h.bucket = policy.Of(h.key)
	if _, err := tx.exec(`UPDATE flotilla_pipelines SET key = ?, bucket = ? WHERE id = ?`, h.key, h.bucket, h.id); err != nil {
		return store.Pipeline{}, wrap(err, "create pipeline %q", np.Name)
	}
	if err := createSteps(tx, h, steps, nil, nil, moveDetails{}); err != nil {
		return store.Pipeline{}, err
	}
	return loadPipeline(tx.ctx, tx.conn, h)
}

// checkStepPayloads refuses a step whose payload is not JSON, as the other
// stores do.
func checkStepPayloads(steps []task.Step) error {
	for _, st := range steps {
		if err := checkDoc("payload of step "+strconv.Quote(st.Name), st.Payload); err != nil {
			return err
		}
	}
	return nil
}

// stepColumns are the columns of a new step's row: a task's, and its place
// in its pipeline.
const stepColumns = insertColumns + `, pipeline_id, step, deps_left`

var stepMarks = marks(insertParams + 3)

// depsChunk is how many dependency rows one INSERT carries (5 parameters
// each).
const depsChunk = 200

// createSteps creates steps (in CheckSteps order) of pipeline h inside the
// writer's transaction, as store.PlanBirths decides. current maps the names
// of steps outside steps to the tasks their dependents will depend on, and
// status says how those ended (or that they have not): the write lock keeps
// them as read until the transaction ends. m supplies the node and epoch
// recorded on the skips it makes.
func createSteps(tx *wtx, h pipelineHead, steps []task.Step, current map[string]int64,
	status map[string]task.Status, m moveDetails) error {
	births := store.PlanBirths(steps, func(name string) task.Status { return status[name] })
	created := make([]*task.Task, len(steps))
	for from := 0; from < len(steps); from += insertChunk {
		to := min(from+insertChunk, len(steps))
		args := make([]any, 0, (insertParams+3)*(to-from))
		for i := from; i < to; i++ {
			st := steps[i]
			t := newTaskRow(store.NewTask{
				Kind: st.Kind, Key: h.key, Bucket: h.bucket, Priority: st.Priority, MaxAttempts: st.MaxAttempts,
				Timeout: st.Timeout, Payload: st.Payload, Pending: births[i].Status != task.Queued,
			}, tx.now)
			t.Pipeline, t.Step = h.id, st.Name
			created[i] = t
			args = append(append(args, rowArgs(t)...), h.id, st.Name, births[i].DepsLeft)
		}
		q := `INSERT INTO flotilla_tasks (` + stepColumns + `) VALUES ` +
			strings.Repeat(stepMarks+", ", to-from-1) + stepMarks + ` RETURNING id`
		ids, err := insertRows(tx, q, args)
		if err != nil {
			return wrap(err, "create steps %d-%d of %d of pipeline %d", from, to-1, len(steps), h.id)
		}
		if len(ids) != to-from {
			return fmt.Errorf("create steps %d-%d of pipeline %d: %d ids came back", from, to-1, h.id, len(ids))
		}
		// Ascending ids in the order of the VALUES, as insertTasks relies on.
		slices.Sort(ids)
		for i, id := range ids {
			created[from+i].ID = id
		}
	}
	ids := make(map[string]int64, len(current)+len(steps))
	for name, id := range current {
		ids[name] = id
	}
	var deps []any
	for i, st := range steps {
		ids[st.Name] = created[i].ID
		for j, d := range st.DependsOn {
			deps = append(deps, created[i].ID, ids[d.Step], d.Step, d.Policy(), j)
		}
	}
	for len(deps) > 0 {
		n := min(len(deps)/5, depsChunk)
		q := `INSERT INTO flotilla_task_deps (task_id, dep_id, dep_step, on_policy, ord) VALUES ` +
			strings.Repeat(`(?, ?, ?, ?, ?), `, n-1) + `(?, ?, ?, ?, ?)`
		if _, err := tx.exec(q, deps[:5*n]...); err != nil {
			return wrap(err, "record the dependencies of the steps of pipeline %d", h.id)
		}
		deps = deps[5*n:]
	}
	var due []int
	for _, t := range created {
		if t.Status == task.Queued {
			due = append(due, t.Bucket)
		}
	}
	tx.announceTasks(due...)
	for i, b := range births {
		if b.Status != task.Skipped {
			continue
		}
		t, err := tx.task(created[i].ID, created[i])
		if err != nil {
			return err
		}
		// A skip already made by an earlier one's resolution stands.
		if t.Status != task.Pending {
			continue
		}
		if err := move(tx, t, task.Skipped, moveDetails{reason: b.SkipReason, node: m.node, epoch: m.epoch}); err != nil {
			return err
		}
	}
	return nil
}

// task returns the op's copy of task id, reading it on first use (or taking
// fresh, a row the op has just written). Resolving a pipeline's dependents
// moves tasks the op did not name; every move of one op goes through this
// one copy, so that none is written from a stale read.
func (tx *wtx) task(id int64, fresh *task.Task) (*task.Task, error) {
	if t := tx.tasks[id]; t != nil {
		return t, nil
	}
	t := fresh
	if t == nil {
		var err error
		if t, err = loadTask(tx, id); err != nil {
			return nil, err
		}
		if t == nil {
			return nil, taskNotFound(id)
		}
	}
	if tx.tasks == nil {
		tx.tasks = map[int64]*task.Task{}
	}
	tx.tasks[id] = t
	return t, nil
}

// dependentsSQL reads the dependents of a task that ends which still count
// their dependencies down: pending, or paused while pending.
// The count it reads is the row's, which the op's own count (wtx.depsLeft)
// replaces for a step the op has counted down already.
const dependentsSQL = `SELECT d.task_id, d.dep_step, d.on_policy, c.deps_left
FROM flotilla_task_deps d JOIN flotilla_tasks c ON c.id = d.task_id
WHERE d.dep_id = ? AND (c.status = 'pending' OR (c.status = 'paused' AND c.deps_left > 0))
ORDER BY d.task_id`

// resolveDependents is called by move when a pipeline task ends, inside the
// same transaction: each pending task that depends on it has one
// dependency fewer to wait for; it is skipped, with its descendants, when
// the end is not one its policy accepts, and queued when it was the last
// one. A step paused while pending counts down and is skipped alike, but is
// not queued: resuming it does. The move's node and epoch are recorded on
// these moves.
func resolveDependents(tx *wtx, t *task.Task, m moveDetails) error {
	type edge struct {
		task     int64
		step, on string
		left     int
	}
	rows, err := tx.query(dependentsSQL, t.ID)
	if err != nil {
		return wrap(err, "dependents of task %d", t.ID)
	}
	var edges []edge
	for rows.Next() {
		var e edge
		if err := rows.Scan(&e.task, &e.step, &e.on, &e.left); err != nil {
			rows.Close()
			return wrap(err, "dependents of task %d", t.ID)
		}
		edges = append(edges, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap(err, "dependents of task %d", t.ID)
	}
	for _, e := range edges {
		child, err := tx.task(e.task, nil)
		if err != nil {
			return err
		}
		if child.Status != task.Pending && child.Status != task.Paused {
			continue // skipped meanwhile by another of its dependencies
		}
		left, counted := tx.depsLeft[child.ID]
		if !counted {
			left = e.left
		}
		left--
		tx.countDown(child.ID, left, counted)
		switch {
		case !task.Accepts(e.on, t.Status):
			err = move(tx, child, task.Skipped, moveDetails{
				reason: store.DependencyEndReason(e.step, t.Status, e.on), node: m.node, epoch: m.epoch,
			})
		case left == 0 && child.Status == task.Pending:
			err = move(tx, child, task.Queued, moveDetails{reason: store.ReasonDependenciesMet, node: m.node, epoch: m.epoch})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// countDown records that step id has left dependencies to wait for; the
// op writes it when it ends (flushDeps).
func (tx *wtx) countDown(id int64, left int, counted bool) {
	if tx.depsLeft == nil {
		tx.depsLeft, tx.depsDirty = map[int64]int{}, map[int64]bool{}
	}
	tx.depsDirty[id] = true
	if !counted {
		tx.depsOrder = append(tx.depsOrder, id)
	}
	tx.depsLeft[id] = left
}

// checkAppend checks the steps that t's attempt appends, against the names
// its pipeline has now.
func checkAppend(tx *wtx, t *task.Task, steps []task.Step) ([]task.Step, error) {
	if t.Pipeline == 0 {
		return nil, fmt.Errorf("appending steps: task %d is not a step of a pipeline: %w", t.ID, store.ErrInvalid)
	}
	rows, err := tx.query(`SELECT DISTINCT step FROM flotilla_tasks WHERE pipeline_id = ?`, t.Pipeline)
	if err != nil {
		return nil, wrap(err, "steps of pipeline %d", t.Pipeline)
	}
	taken := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, wrap(err, "steps of pipeline %d", t.Pipeline)
		}
		taken[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "steps of pipeline %d", t.Pipeline)
	}
	out, err := store.CheckAppend(t.Step, steps, func(name string) bool { return taken[name] })
	if err == nil {
		err = checkStepPayloads(out)
	}
	if err != nil {
		return nil, fmt.Errorf("appending steps to pipeline %d: %w", t.Pipeline, err)
	}
	return out, nil
}

// appendSteps creates the steps t appended, now that its move has ended it.
func appendSteps(tx *wtx, t *task.Task, steps []task.Step, m moveDetails) error {
	h, err := readPipelineHead(tx.ctx, tx.conn, t.Pipeline)
	if err != nil {
		return err
	}
	return createSteps(tx, h, steps, map[string]int64{t.Step: t.ID}, map[string]task.Status{t.Step: t.Status}, m)
}

// GetPipeline reads a pipeline and its tasks in one snapshot.
func (s *Store) GetPipeline(ctx context.Context, id int64) (store.Pipeline, error) {
	if err := s.checkOpen(); err != nil {
		return store.Pipeline{}, err
	}
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return store.Pipeline{}, wrap(err, "pipeline %d", id)
	}
	defer func() { _ = tx.Rollback() }()
	h, err := readPipelineHead(ctx, tx, id)
	if err != nil {
		return store.Pipeline{}, err
	}
	return loadPipeline(ctx, tx, h)
}

// loadPipeline reads the tasks of pipeline h and the dependencies of each
// step's current task.
func loadPipeline(ctx context.Context, q querier, h pipelineHead) (store.Pipeline, error) {
	p := store.Pipeline{ID: h.id, Name: h.name, Key: h.key, Bucket: h.bucket, CreatedAt: h.createdAt}
	rows, err := q.QueryContext(ctx, `SELECT `+taskColumns+` FROM flotilla_tasks WHERE pipeline_id = ? ORDER BY id`, h.id)
	if err != nil {
		return store.Pipeline{}, requireSchema(wrap(err, "tasks of pipeline %d", h.id))
	}
	index := map[string]int{}
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			rows.Close()
			return store.Pipeline{}, wrap(err, "tasks of pipeline %d", h.id)
		}
		i, ok := index[t.Step]
		if !ok {
			i = len(p.Steps)
			index[t.Step] = i
			p.Steps = append(p.Steps, store.PipelineStep{Name: t.Step})
		}
		p.Steps[i].Task = t // ascending ids: the last is current
		p.Steps[i].Tries++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return store.Pipeline{}, wrap(err, "tasks of pipeline %d", h.id)
	}
	ids := make([]int64, len(p.Steps))
	byTask := make(map[int64]int, len(p.Steps))
	for i, st := range p.Steps {
		ids[i], byTask[st.Task.ID] = st.Task.ID, i
	}
	deps, err := q.QueryContext(ctx, `SELECT task_id, dep_step, on_policy FROM flotilla_task_deps
		WHERE task_id IN (SELECT value FROM json_each(?)) ORDER BY task_id, ord`, int64sJSON(ids))
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
	return p, wrapIf(deps.Err(), "dependencies of pipeline "+strconv.FormatInt(h.id, 10))
}

const dependencyResultsSQL = `
SELECT d.dep_step, r.result
FROM flotilla_tasks x
LEFT JOIN flotilla_task_deps d ON d.task_id = x.id
LEFT JOIN flotilla_tasks r ON r.id = d.dep_id
WHERE x.id = ?`

// dependencyResultsSizeSQL sums the dependencies' results in bytes,
// without reading them out.
const dependencyResultsSizeSQL = `
SELECT coalesce(sum(length(CAST(r.result AS BLOB))), 0)
FROM flotilla_task_deps d
JOIN flotilla_tasks r ON r.id = d.dep_id
WHERE d.task_id = ?`

// DependencyResults reads the results of a task's dependencies, once their
// size in all is known to be within max.
func (s *Store) DependencyResults(ctx context.Context, id int64, max int64) (map[string]json.RawMessage, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var size int64
	if err := s.rdb.QueryRowContext(ctx, dependencyResultsSizeSQL, id).Scan(&size); err != nil {
		return nil, requireSchema(wrap(err, "dependency results of task %d", id))
	}
	if size > max {
		return nil, &store.DependencyResultsTooLargeError{Task: id, Bytes: size, Max: max}
	}
	rows, err := s.rdb.QueryContext(ctx, dependencyResultsSQL, id)
	if err != nil {
		return nil, requireSchema(wrap(err, "dependency results of task %d", id))
	}
	defer rows.Close()
	found := false
	out := map[string]json.RawMessage{}
	for rows.Next() {
		var step, result sql.NullString
		if err := rows.Scan(&step, &result); err != nil {
			return nil, wrap(err, "dependency results of task %d", id)
		}
		found = true
		if step.Valid {
			out[step.String] = doc(result)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "dependency results of task %d", id)
	}
	if !found {
		return nil, taskNotFound(id)
	}
	return out, nil
}

// RetryPipeline runs a step and its unsucceeded descendants again, in one
// write: the write lock keeps the pipeline as read until the new tasks are
// in, so that no dependency ends unseen.
func (s *Store) RetryPipeline(ctx context.Context, id int64, from string) (store.Pipeline, error) {
	var out store.Pipeline
	err := s.write(ctx, func(tx *wtx) error {
		h, err := readPipelineHead(tx.ctx, tx.conn, id)
		if err != nil {
			return err
		}
		p, err := loadPipeline(tx.ctx, tx.conn, h)
		if err != nil {
			return err
		}
		out, _, err = retryFrom(tx, h, p, from)
		return err
	})
	if err != nil {
		return store.Pipeline{}, requireSchema(err)
	}
	return out, nil
}

// retryFrom runs the step from of p (read in tx) again with its
// unsucceeded descendants, as new tasks, and answers the pipeline after and
// the steps run again: RetryPipeline and RetryTask alike.
func retryFrom(tx *wtx, h pipelineHead, p store.Pipeline, from string) (store.Pipeline, []string, error) {
	names, err := store.RetryPlan(p, from)
	if err != nil {
		return store.Pipeline{}, nil, err
	}
	again := map[string]bool{}
	for _, n := range names {
		again[n] = true
	}
	current := map[string]int64{}
	status := map[string]task.Status{}
	for _, st := range p.Steps {
		status[st.Name] = st.Task.Status
		if !again[st.Name] {
			current[st.Name] = st.Task.ID
		}
	}
	if err := createSteps(tx, h, store.RetrySteps(p, names), current, status, moveDetails{}); err != nil {
		return store.Pipeline{}, nil, err
	}
	after, err := loadPipeline(tx.ctx, tx.conn, h)
	return after, names, err
}
