package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// taskColumns is the task row as scanTask reads it.
const taskColumns = `id, kind, key, bucket, status, status_version, priority, run_at, attempt, max_attempts,
    timeout_ms, payload, result, progress, error, claim_seq, owner, node, epoch, lease_expires_at,
    stop_requested, pause_requested, schedule, scheduled_for, unique_key, created_at, started_at,
    finished_at, updated_at, pipeline_id, step, limit_key, resources, wait_reason, metadata`

type scanner interface{ Scan(dest ...any) error }

func scanTask(row scanner) (*task.Task, error) {
	var (
		t                                                 task.Task
		status                                            string
		timeoutMS                                         int64
		payload, result, progress                         sql.NullString
		owner, schedule, uniqueKey                        sql.NullString
		runAt, leaseExp, scheduledFor, createdAt, started sql.NullInt64
		finished, updated, pipeline                       sql.NullInt64
		step, resources, metadata                         sql.NullString
	)
	err := row.Scan(&t.ID, &t.Kind, &t.Key, &t.Bucket, &status, &t.StatusVersion, &t.Priority, &runAt,
		&t.Attempt, &t.MaxAttempts, &timeoutMS, &payload, &result, &progress, &t.Error, &t.ClaimSeq, &owner,
		&t.Node, &t.Epoch, &leaseExp, &t.StopRequested, &t.PauseRequested, &schedule, &scheduledFor,
		&uniqueKey, &createdAt, &started, &finished, &updated, &pipeline, &step,
		&t.LimitKey, &resources, &t.WaitReason, &metadata)
	if err != nil {
		return nil, err
	}
	t.Status = task.Status(status)
	t.Timeout = time.Duration(timeoutMS) * time.Millisecond
	t.Payload = doc(payload)
	t.Result = doc(result)
	t.Progress = doc(progress)
	t.Owner, t.Schedule, t.UniqueKey = owner.String, schedule.String, uniqueKey.String
	t.Pipeline, t.Step = pipeline.Int64, step.String
	if t.Resources, err = resourcesOf(resources); err != nil {
		return nil, fmt.Errorf("task %d: %w", t.ID, err)
	}
	if metadata.Valid {
		if err := json.Unmarshal([]byte(metadata.String), &t.Metadata); err != nil {
			return nil, fmt.Errorf("task %d: metadata %q: %w", t.ID, metadata.String, err)
		}
	}
	t.RunAt, t.LeaseExpiresAt, t.ScheduledFor = fromMicros(runAt), fromMicros(leaseExp), fromMicros(scheduledFor)
	t.CreatedAt, t.StartedAt, t.FinishedAt, t.UpdatedAt = fromMicros(createdAt), fromMicros(started),
		fromMicros(finished), fromMicros(updated)
	return &t, nil
}

func doc(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return nil
	}
	return json.RawMessage(s.String)
}

// docArg is a document as stored: JSON text, NULL for none.
func docArg(d json.RawMessage) any {
	if d == nil {
		return nil
	}
	return string(d)
}

// jsonOrNull turns "no document" into JSON null, as the payload column's
// default does, so that readers can always unmarshal it.
func jsonOrNull(d json.RawMessage) json.RawMessage {
	if len(d) == 0 {
		return json.RawMessage("null")
	}
	return d
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func taskNotFound(id int64) error {
	return fmt.Errorf("task %d: %w", id, store.ErrNotFound)
}

// insertChunk is how many tasks one INSERT statement carries: per row,
// SQLite's cost is mostly the statement's own, so a bulk insert writes
// many rows per statement (17 parameters a row, far below SQLite's limit
// of 32,766).
const insertChunk = 64

// newTaskRow is a checked NewTask as its row will be, but for its id.
func newTaskRow(nt store.NewTask, now time.Time) *task.Task {
	runAt := dbTime(nt.RunAt)
	if runAt.IsZero() {
		runAt = dbTime(now.Add(nt.Delay))
	}
	status := task.Queued
	switch {
	case nt.Pending:
		status = task.Pending
	case runAt.After(now):
		status = task.Scheduled
	}
	if runAt.Before(now) {
		runAt = now
	}
	maxAttempts := nt.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = store.DefaultMaxAttempts
	}
	return &task.Task{
		Kind: nt.Kind, Key: nt.Key, Bucket: nt.Bucket, Status: status, StatusVersion: 1, Priority: nt.Priority,
		RunAt: runAt, MaxAttempts: maxAttempts, Timeout: nt.Timeout, Payload: jsonOrNull(nt.Payload),
		UniqueKey: nt.UniqueKey, Schedule: nt.Schedule, ScheduledFor: dbTime(nt.ScheduledFor),
		LimitKey: nt.LimitKey, Resources: maps.Clone(nt.Resources), Metadata: store.NoEmptyMetadata(nt.Metadata),
		CreatedAt: now, UpdatedAt: now,
	}
}

// rowArgs are t's values in the order of insertColumns.
func rowArgs(t *task.Task) []any {
	return []any{t.Kind, t.Key, t.Bucket, string(t.Status), t.Priority, t.RunAt.UnixMicro(), t.MaxAttempts,
		t.Timeout.Milliseconds(), string(t.Payload), nullString(t.UniqueKey), nullString(t.Schedule),
		micros(t.ScheduledFor), t.CreatedAt.UnixMicro(), t.UpdatedAt.UnixMicro(), t.LimitKey, resourcesArg(t.Resources),
		metadataArg(t.Metadata)}
}

// metadataArg is a task's metadata as stored: a JSON object, NULL for none.
func metadataArg(md map[string]string) any {
	if len(md) == 0 {
		return nil
	}
	b, _ := json.Marshal(md) // a map of strings always marshals
	return string(b)
}

// resourcesArg is a task's resources as stored: a JSON object, NULL for
// none.
func resourcesArg(r map[string]int64) any {
	if len(r) == 0 {
		return nil
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// resourcesOf reads the resources column; nil for none.
func resourcesOf(s sql.NullString) (store.Resources, error) {
	if !s.Valid || s.String == "" {
		return nil, nil
	}
	var r store.Resources
	if err := json.Unmarshal([]byte(s.String), &r); err != nil {
		return nil, fmt.Errorf("resources %q: %w", s.String, err)
	}
	return r, nil
}

const insertColumns = `kind, key, bucket, status, priority, run_at, max_attempts, timeout_ms, payload,
    unique_key, schedule, scheduled_for, created_at, updated_at, limit_key, resources, metadata`

// insertParams is the number of parameters of one row of insertColumns.
const insertParams = 17

var rowMarks = marks(insertParams)

// marks is a row of n parameters: (?, ?, ...).
func marks(n int) string {
	return "(" + strings.Repeat("?, ", n-1) + "?)"
}

// insertSQL inserts n rows and returns their ids.
func insertSQL(n int, orIgnore bool) string {
	verb := "INSERT"
	if orIgnore {
		verb = "INSERT OR IGNORE"
	}
	return verb + ` INTO flotilla_tasks (` + insertColumns + `) VALUES ` +
		strings.Repeat(rowMarks+", ", n-1) + rowMarks + ` RETURNING id`
}

// insertTasks creates a checked batch inside tx and announces the buckets
// of the tasks due now. With skipConflicts a task that hits a unique index
// (a schedule's tick fired before, a busy unique key) is not created and
// its entry is nil.
func insertTasks(tx *wtx, tasks []store.NewTask, skipConflicts bool) ([]*task.Task, error) {
	out := make([]*task.Task, len(tasks))
	chunk := insertChunk
	if skipConflicts {
		// One row a statement: a row the index refuses returns no id,
		// and the others' ids must still be matched to their tasks.
		chunk = 1
	}
	for from := 0; from < len(tasks); from += chunk {
		to := min(from+chunk, len(tasks))
		args := make([]any, 0, insertParams*(to-from))
		for i := from; i < to; i++ {
			out[i] = newTaskRow(tasks[i], tx.now)
			args = append(args, rowArgs(out[i])...)
		}
		ids, err := insertRows(tx, insertSQL(to-from, skipConflicts), args)
		if err != nil {
			err = translate(err)
			if errors.Is(err, store.ErrDuplicate) {
				return nil, duplicateError(tx, tasks, from, to)
			}
			return nil, fmt.Errorf("create tasks %d-%d of %d: %w", from, to-1, len(tasks), err)
		}
		if skipConflicts && len(ids) == 0 {
			out[from] = nil
			continue
		}
		if len(ids) != to-from {
			return nil, fmt.Errorf("create tasks %d-%d of %d: %d ids came back", from, to-1, len(tasks), len(ids))
		}
		// One statement's rows take ascending ids in the order of its
		// VALUES (each new rowid is the largest plus one), whatever order
		// RETURNING lists them in.
		slices.Sort(ids)
		for i, id := range ids {
			out[from+i].ID = id
		}
	}
	var due []int
	for _, t := range out {
		if t != nil && t.Status == task.Queued {
			due = append(due, t.Bucket)
		}
	}
	tx.announceTasks(due...)
	return out, nil
}

// finalStatusesSQL lists the final states as the unique key's partial
// index does, so that a query with it can use the index.
const finalStatusesSQL = `('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped')`

// duplicateError names the task of tasks[from:to] that the unique index
// refused, and the task holding its unique key or fired for its tick, read
// in tx (only the refused statement was undone).
func duplicateError(tx *wtx, tasks []store.NewTask, from, to int) error {
	return store.FindDuplicate(tasks, from, to, func(nt store.NewTask) (int64, error) {
		var id int64
		err := tx.queryRow(`SELECT id FROM flotilla_tasks
			WHERE (unique_key = ? AND status NOT IN `+finalStatusesSQL+`) OR (schedule = ? AND scheduled_for = ?)
			ORDER BY id LIMIT 1`, nullString(nt.UniqueKey), nullString(nt.Schedule), micros(dbTime(nt.ScheduledFor))).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		return id, wrapIf(err, "read the task holding a unique key")
	})
}

func insertRows(tx *wtx, query string, args []any) ([]int64, error) {
	rows, err := tx.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// announceTasks tells listeners that tasks became claimable in buckets.
func (tx *wtx) announceTasks(buckets ...int) {
	if len(buckets) > 0 {
		tx.notify(store.TopicTasks, bucket.Of(buckets...).String())
	}
}

// CreateTasks inserts the tasks all or none, and announces the buckets of
// those that can be claimed at once.
func (s *Store) CreateTasks(ctx context.Context, tasks []store.NewTask) ([]*task.Task, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.CheckNewTasks(tasks, n); err != nil {
		return nil, err
	}
	var out []*task.Task
	err = s.write(ctx, func(tx *wtx) error {
		var err error
		out, err = insertTasks(tx, tasks, false)
		return err
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// GetTask reads one task.
func (s *Store) GetTask(ctx context.Context, id int64) (*task.Task, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	t, err := scanTask(s.rdb.QueryRowContext(ctx, `SELECT `+taskColumns+` FROM flotilla_tasks WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, taskNotFound(id)
	}
	if err != nil {
		return nil, requireSchema(wrap(err, "read task %d", id))
	}
	return t, nil
}

const defaultListLimit = 100

// ListTasks returns matching tasks, newest first.
func (s *Store) ListTasks(ctx context.Context, f store.TaskFilter) ([]*task.Task, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	want, err := store.ParsePayloadFilter(f.Payload)
	if err != nil {
		return nil, err
	}
	var (
		where []string
		args  []any
	)
	if len(f.Statuses) > 0 {
		marks := make([]string, len(f.Statuses))
		for i, st := range f.Statuses {
			if !st.Valid() {
				return nil, fmt.Errorf("%w: unknown task status %q", store.ErrInvalid, st)
			}
			marks[i] = "?"
			args = append(args, string(st))
		}
		where = append(where, "status IN ("+strings.Join(marks, ", ")+")")
	}
	if f.Buckets != nil {
		where = append(where, "bucket IN (SELECT value FROM json_each(?))")
		args = append(args, intsJSON(f.Buckets.Slice()))
	}
	for _, c := range []struct{ col, val string }{{"kind", f.Kind}, {"key", f.Key}, {"schedule", f.Schedule}, {"node", f.Node}} {
		if c.val != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.val)
		}
	}
	if f.BeforeID > 0 {
		where = append(where, "id < ?")
		args = append(args, f.BeforeID)
	}
	q := `SELECT ` + taskColumns + ` FROM flotilla_tasks`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	limit := limitOr(f.Limit, defaultListLimit)
	q += " ORDER BY id DESC"
	if want == nil {
		q += " LIMIT ?"
		args = append(args, limit)
	}
	// With a payload filter the rows the other filters keep are read
	// newest first and tested in Go, by the rules of PostgreSQL's jsonb @>
	// (store.PayloadContains), until the page is full: SQLite's JSON
	// functions have no containment, and one written with json_tree would
	// still read every candidate row.
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, requireSchema(wrap(err, "list tasks"))
	}
	defer rows.Close()
	out := []*task.Task{}
	for len(out) < limit && rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, wrap(err, "list tasks")
		}
		if want == nil || store.PayloadContains(t.Payload, want) {
			out = append(out, t)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "list tasks")
	}
	return out, nil
}

// intsJSON is a list of ints as a JSON array, which json_each reads: one
// parameter for a list of any length.
func intsJSON(v []int) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func stringsJSON(v []string) string {
	if v == nil {
		v = []string{}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TaskEvents returns a task's audit trail, creation first. The creation
// event is derived from the task row: the state it was created in is where
// its second event starts, or its state now if it has none.
func (s *Store) TaskEvents(ctx context.Context, id int64) ([]task.Event, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	conn, err := s.rdb.Conn(ctx)
	if err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	defer conn.Close()
	// One read transaction: the row and its events from one snapshot.
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	defer func() { _ = tx.Rollback() }()
	var (
		status    string
		createdAt sql.NullInt64
		created   string
	)
	// A task that runs another again says so, and who asked, at its
	// creation (RetryTask's link).
	err = tx.QueryRowContext(ctx, `SELECT status, created_at,
		coalesce((SELECT reason FROM flotilla_task_retries WHERE retry_id = ?1), 'created')
		FROM flotilla_tasks WHERE id = ?1`, id).Scan(&status, &createdAt, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, taskNotFound(id)
	}
	if err != nil {
		return nil, requireSchema(wrap(err, "events of task %d", id))
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, from_status, to_status, at, node, epoch, attempt, reason, error
		FROM flotilla_task_events WHERE task_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	defer rows.Close()
	out := []task.Event{{TaskID: id, Seq: 1, To: task.Status(status), At: fromMicros(createdAt), Reason: created}}
	for rows.Next() {
		var (
			e        task.Event
			from, to string
			at       sql.NullInt64
		)
		if err := rows.Scan(&e.Seq, &from, &to, &at, &e.Node, &e.Epoch, &e.Attempt, &e.Reason, &e.Error); err != nil {
			return nil, wrap(err, "events of task %d", id)
		}
		e.TaskID, e.From, e.To, e.At = id, task.Status(from), task.Status(to), fromMicros(at)
		if e.Seq == 2 {
			out[0].To = e.From
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	return out, nil
}

// loadTask reads a task inside a write transaction; nil when there is none.
func loadTask(tx *wtx, id int64) (*task.Task, error) {
	t, err := scanTask(tx.queryRow(`SELECT `+taskColumns+` FROM flotilla_tasks WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap(err, "read task %d", id)
	}
	return t, nil
}

// Transition moves one task by compare-and-set on its status_version.
func (s *Store) Transition(ctx context.Context, tr store.Transition) (*task.Task, error) {
	if !tr.To.Valid() {
		return nil, fmt.Errorf("%w: unknown task status %q", store.ErrInvalid, tr.To)
	}
	if tr.To == task.Running {
		return nil, fmt.Errorf("%w: task %d: only a claim moves a task to running", store.ErrInvalid, tr.ID)
	}
	if tr.NoWait && s.isLocked(tr.ID) {
		return nil, fmt.Errorf("task %d: %w", tr.ID, store.ErrBusy)
	}
	var out *task.Task
	write := s.write
	if tr.NoWait {
		// Nor for another process's lock on the whole file.
		write = s.writeNoWait
	}
	err := write(ctx, func(tx *wtx) error {
		t, err := loadTask(tx, tr.ID)
		if err != nil {
			return err
		}
		if t == nil {
			return taskNotFound(tr.ID)
		}
		if t.StatusVersion != tr.Version {
			return fmt.Errorf("task %d is at status version %d (%s), not %d: %w",
				t.ID, t.StatusVersion, t.Status, tr.Version, store.ErrConflict)
		}
		if g := tr.Guard; g != nil {
			live, err := leaseLiveFor(tx, t.Bucket, g.Owner, g.Epoch)
			if err != nil {
				return err
			}
			if !live {
				return fmt.Errorf("task %d: %s does not hold bucket %d under epoch %d: %w",
					t.ID, g.Owner, t.Bucket, g.Epoch, store.ErrFenced)
			}
		}
		want, err := resumeDestination(tx, t, tr.To)
		if err != nil {
			return err
		}
		to, err := destination(t, want)
		if err != nil {
			return err
		}
		if err := move(tx, t, to, moveDetails{
			reason: tr.Reason, errText: tr.Error, node: tr.Node, epoch: tr.Epoch, delay: tr.Delay,
		}); err != nil {
			return err
		}
		out = t
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// destination decides where a requested move out of t's state goes,
// reading the pending requests from the row itself (task.Destination).
func destination(t *task.Task, to task.Status) (task.Status, error) {
	return task.Destination(t, to)
}

// resumeDestination sends a paused pipeline step that still waits for
// dependencies back to pending when it is resumed (task.ResumeDestination),
// reading its count in the writer's transaction, which every decrement
// goes through.
func resumeDestination(tx *wtx, t *task.Task, want task.Status) (task.Status, error) {
	if t.Status != task.Paused || t.Pipeline == 0 {
		return want, nil
	}
	left, counted := tx.depsLeft[t.ID]
	if !counted {
		if err := tx.queryRow(`SELECT deps_left FROM flotilla_tasks WHERE id = ?`, t.ID).Scan(&left); err != nil {
			return "", wrap(err, "dependencies left of task %d", t.ID)
		}
	}
	return task.ResumeDestination(t.Status, want, left), nil
}

// moveDetails is what a transition records besides its destination.
type moveDetails struct {
	reason  string
	errText string
	node    string
	epoch   int64
	delay   time.Duration
	// saved: the caller writes the row itself (a claim updates all its
	// rows in one statement).
	saved bool
}

const saveTaskSQL = `UPDATE flotilla_tasks SET status = ?, status_version = ?, run_at = ?, attempt = ?,
    result = ?, progress = ?, error = ?, claim_seq = ?, owner = ?, node = ?, epoch = ?, lease_expires_at = ?,
    stop_requested = ?, pause_requested = ?, started_at = ?, finished_at = ?, updated_at = ?,
    deps_left = coalesce(?, deps_left)
WHERE id = ?`

// move applies a transition the caller has already allowed to t and to its
// row, writes its audit event and answers its pending commands where the
// move ends them. Claims set their lease fields before calling it.
func move(tx *wtx, t *task.Task, to task.Status, m moveDetails) error {
	now := tx.now
	from := t.Status
	if task.ApplyMove(t, to, m.errText, now, dbTime(now.Add(m.delay))) {
		tx.announceTasks(t.Bucket)
	}
	if from.Active() && !to.Active() || to.Terminal() {
		if err := ackLeft(tx, t.ID, to, m.node); err != nil {
			return err
		}
	}
	if to.Terminal() {
		t.FinishedAt = now
	}
	t.Status = to
	t.StatusVersion++
	t.UpdatedAt = now
	if !m.saved {
		if err := saveTask(tx, t); err != nil {
			return err
		}
	}
	tx.events = append(tx.events, task.Event{TaskID: t.ID, Seq: t.StatusVersion, From: from, To: to, At: now,
		Node: m.node, Epoch: m.epoch, Attempt: t.Attempt, Reason: m.reason, Error: m.errText})
	if to.Terminal() && t.Pipeline != 0 {
		// In the same transaction as the move, as the PostgreSQL store
		// does it in the same statement: release or skip the steps that
		// wait for it.
		return resolveDependents(tx, t, m)
	}
	return nil
}

func saveTask(tx *wtx, t *task.Task) error {
	// A count of dependencies the op changed goes with the row, so that a
	// step released by the op is written once.
	var left any
	if tx.depsDirty[t.ID] {
		left = tx.depsLeft[t.ID]
	}
	_, err := tx.exec(saveTaskSQL, string(t.Status), t.StatusVersion, t.RunAt.UnixMicro(), t.Attempt,
		docArg(t.Result), docArg(t.Progress), t.Error, t.ClaimSeq, nullString(t.Owner), t.Node, t.Epoch,
		micros(t.LeaseExpiresAt), t.StopRequested, t.PauseRequested, micros(t.StartedAt), micros(t.FinishedAt),
		t.UpdatedAt.UnixMicro(), left, t.ID)
	if err != nil {
		return wrap(err, "write task %d", t.ID)
	}
	if left != nil {
		tx.depsDirty[t.ID] = false
	}
	return nil
}
