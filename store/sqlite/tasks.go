package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
    finished_at, updated_at`

type scanner interface{ Scan(dest ...any) error }

func scanTask(row scanner) (*task.Task, error) {
	var (
		t                                                 task.Task
		status                                            string
		timeoutMS                                         int64
		payload, result, progress                         sql.NullString
		owner, schedule, uniqueKey                        sql.NullString
		runAt, leaseExp, scheduledFor, createdAt, started sql.NullInt64
		finished, updated                                 sql.NullInt64
	)
	err := row.Scan(&t.ID, &t.Kind, &t.Key, &t.Bucket, &status, &t.StatusVersion, &t.Priority, &runAt,
		&t.Attempt, &t.MaxAttempts, &timeoutMS, &payload, &result, &progress, &t.Error, &t.ClaimSeq, &owner,
		&t.Node, &t.Epoch, &leaseExp, &t.StopRequested, &t.PauseRequested, &schedule, &scheduledFor,
		&uniqueKey, &createdAt, &started, &finished, &updated)
	if err != nil {
		return nil, err
	}
	t.Status = task.Status(status)
	t.Timeout = time.Duration(timeoutMS) * time.Millisecond
	t.Payload = doc(payload)
	t.Result = doc(result)
	t.Progress = doc(progress)
	t.Owner, t.Schedule, t.UniqueKey = owner.String, schedule.String, uniqueKey.String
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

// checkNewTasks refuses a batch that no store could carry out, naming the
// first bad task, by the same rules as the PostgreSQL store's
// validateTasks, so that both accept the same tasks. It is the one place
// the SQLite store validates new tasks.
func checkNewTasks(tasks []store.NewTask, numBuckets int) error {
	seen := make(map[string]int)
	for i, nt := range tasks {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("task %d of %d: %s: %w", i, len(tasks), fmt.Sprintf(format, args...), store.ErrInvalid)
		}
		switch {
		case nt.Kind == "":
			return bad("no kind")
		case len(nt.Payload) > 0 && !json.Valid(nt.Payload):
			return bad("payload is not valid JSON")
		case nt.Bucket < 0 || (numBuckets > 0 && nt.Bucket >= numBuckets):
			return bad("bucket %d does not exist: this fleet has buckets 0-%d", nt.Bucket, numBuckets-1)
		case nt.MaxAttempts < 0:
			return bad("max attempts %d is negative", nt.MaxAttempts)
		case nt.Priority < math.MinInt32 || nt.Priority > math.MaxInt32:
			return bad("priority %d is out of range", nt.Priority)
		case nt.ScheduledFor.IsZero() != (nt.Schedule == ""):
			return bad("schedule and scheduled-for go together")
		}
		if err := store.CheckTimeout(nt.Timeout); err != nil {
			return bad("%v", err)
		}
		if nt.UniqueKey != "" {
			if j, dup := seen[nt.UniqueKey]; dup {
				return fmt.Errorf("tasks %d and %d of the batch share the unique key %q: %w", j, i, nt.UniqueKey, store.ErrDuplicate)
			}
			seen[nt.UniqueKey] = i
		}
	}
	return nil
}

const insertTaskSQL = `INSERT INTO flotilla_tasks (kind, key, bucket, status, priority, run_at, max_attempts,
    timeout_ms, payload, unique_key, schedule, scheduled_for, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING ` + taskColumns

// insertTasks creates a checked batch inside tx and announces the buckets
// of the tasks due now. With skipConflicts a task that hits a unique index
// (a schedule's tick fired before, a busy unique key) is not created and
// its entry is nil.
func insertTasks(tx *wtx, tasks []store.NewTask, skipConflicts bool) ([]*task.Task, error) {
	out := make([]*task.Task, len(tasks))
	var due []int
	sqlText := insertTaskSQL
	if skipConflicts {
		sqlText = strings.Replace(insertTaskSQL, "INSERT INTO", "INSERT OR IGNORE INTO", 1)
	}
	for i, nt := range tasks {
		now := tx.now
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
		row := tx.queryRow(sqlText, nt.Kind, nt.Key, nt.Bucket, string(status), nt.Priority, runAt.UnixMicro(),
			maxAttempts, nt.Timeout.Milliseconds(), string(jsonOrNull(nt.Payload)), nullString(nt.UniqueKey),
			nullString(nt.Schedule), micros(dbTime(nt.ScheduledFor)), now.UnixMicro(), now.UnixMicro())
		t, err := scanTask(row)
		switch {
		case skipConflicts && errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			err = translate(err)
			if errors.Is(err, store.ErrDuplicate) {
				return nil, fmt.Errorf("task %d of %d: unique key %q already names an unfinished task, or its schedule tick has fired: %w",
					i, len(tasks), nt.UniqueKey, err)
			}
			return nil, fmt.Errorf("create task %d of %d: %w", i, len(tasks), err)
		}
		out[i] = t
		if t.Status == task.Queued {
			due = append(due, t.Bucket)
		}
	}
	tx.announceTasks(due...)
	return out, nil
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
	if err := checkNewTasks(tasks, n); err != nil {
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
	for _, c := range []struct{ col, val string }{{"kind", f.Kind}, {"key", f.Key}, {"schedule", f.Schedule}} {
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
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, limitOr(f.Limit, defaultListLimit))
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, requireSchema(wrap(err, "list tasks"))
	}
	defer rows.Close()
	out := []*task.Task{}
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, wrap(err, "list tasks")
		}
		out = append(out, t)
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
	)
	err = tx.QueryRowContext(ctx, `SELECT status, created_at FROM flotilla_tasks WHERE id = ?`, id).Scan(&status, &createdAt)
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
	out := []task.Event{{TaskID: id, Seq: 1, To: task.Status(status), At: fromMicros(createdAt), Reason: "created"}}
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
	err := s.write(ctx, func(tx *wtx) error {
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
		to, err := destination(t, tr.To)
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

// destination decides where a requested move out of t's state goes, or
// refuses it by the table, reading the pending requests from the row
// itself. The rules are the PostgreSQL store's (stopDestinationSQL): a
// pending stop wins over every way an attempt can end except success; a
// pending pause wins over a retry and a release.
func destination(t *task.Task, to task.Status) (task.Status, error) {
	if endsAttempt(t.Status, to) && (t.Status == task.Stopping || t.StopRequested) {
		return task.Stopped, nil
	}
	if t.Status.Active() && (to == task.Retrying || to == task.Queued) &&
		(t.Status == task.Pausing || t.PauseRequested) {
		return task.Paused, nil
	}
	if !task.CanTransition(t.Status, to) {
		return "", &task.TransitionError{ID: t.ID, From: t.Status, To: to}
	}
	return to, nil
}

// attemptOutcomes are the states an attempt can end in, other than success.
var attemptOutcomes = func() map[task.Status]bool {
	out := map[task.Status]bool{}
	for _, from := range []task.Status{task.Running, task.Stopping, task.Pausing} {
		for _, to := range task.Next(from) {
			if !to.Active() && to != task.Succeeded {
				out[to] = true
			}
		}
	}
	return out
}()

func endsAttempt(from, to task.Status) bool {
	return from.Active() && attemptOutcomes[to]
}

// moveDetails is what a transition records besides its destination.
type moveDetails struct {
	reason  string
	errText string
	node    string
	epoch   int64
	delay   time.Duration
}

const saveTaskSQL = `UPDATE flotilla_tasks SET status = ?, status_version = ?, run_at = ?, attempt = ?,
    result = ?, progress = ?, error = ?, claim_seq = ?, owner = ?, node = ?, epoch = ?, lease_expires_at = ?,
    stop_requested = ?, pause_requested = ?, started_at = ?, finished_at = ?, updated_at = ?
WHERE id = ?`

const insertEventSQL = `INSERT INTO flotilla_task_events
    (task_id, seq, from_status, to_status, at, node, epoch, attempt, reason, error)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// move applies a transition the caller has already allowed to t and to its
// row, writes its audit event and answers its pending commands where the
// move ends them. Claims set their lease fields before calling it.
func move(tx *wtx, t *task.Task, to task.Status, m moveDetails) error {
	now := tx.now
	from := t.Status
	if from.Active() && !to.Active() {
		// The attempt is over: it holds no lease any more. Node, epoch and
		// claim_seq stay for history.
		t.Owner = ""
		t.LeaseExpiresAt = time.Time{}
		t.Error = m.errText
		t.StopRequested, t.PauseRequested = false, false
	} else if m.errText != "" {
		t.Error = m.errText
	}
	switch to {
	case task.Queued:
		t.RunAt = now
		if from.Active() && t.Attempt > 0 {
			// A release: the attempt was handed back unfinished.
			t.Attempt--
		}
		tx.announceTasks(t.Bucket)
	case task.Retrying, task.Scheduled:
		t.RunAt = dbTime(now.Add(m.delay))
		if !t.RunAt.After(now) {
			tx.announceTasks(t.Bucket)
		}
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
	if err := saveTask(tx, t); err != nil {
		return err
	}
	_, err := tx.exec(insertEventSQL, t.ID, t.StatusVersion, string(from), string(to), now.UnixMicro(),
		m.node, m.epoch, t.Attempt, m.reason, m.errText)
	if err != nil {
		return wrap(err, "record the event of task %d", t.ID)
	}
	return nil
}

func saveTask(tx *wtx, t *task.Task) error {
	_, err := tx.exec(saveTaskSQL, string(t.Status), t.StatusVersion, t.RunAt.UnixMicro(), t.Attempt,
		docArg(t.Result), docArg(t.Progress), t.Error, t.ClaimSeq, nullString(t.Owner), t.Node, t.Epoch,
		micros(t.LeaseExpiresAt), t.StopRequested, t.PauseRequested, micros(t.StartedAt), micros(t.FinishedAt),
		t.UpdatedAt.UnixMicro(), t.ID)
	if err != nil {
		return wrap(err, "write task %d", t.ID)
	}
	return nil
}
