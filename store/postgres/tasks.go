package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// copyThreshold is the batch size from which CreateTasks loads with COPY
// instead of one INSERT ... SELECT FROM unnest. COPY takes four round trips
// (begin, reserve ids, copy, commit) to the INSERT's one, but streams rows
// without per-row expression work. Measured per task on PostgreSQL 15
// (BenchmarkCreateTasks): 100 rows, INSERT 18 µs and COPY 17 µs; 200 rows,
// 16 µs and 14 µs; 1,000 rows by COPY 9 µs, 10,000 rows 6 µs.
const copyThreshold = 100

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertTasksHead and insertTasksTail insert the rows of unnest($1..$16) in
// input order (so that ids ascend in input order) and return them, with an
// ON CONFLICT clause between the two where one is wanted. Status and run_at
// come from the database clock: a task due later than now is scheduled,
// otherwise queued with run_at = now (pending when asked for).
const insertTasksHead = `
WITH input AS (
    SELECT i.*, coalesce(i.run_at, statement_timestamp() + i.delay_us * interval '1 microsecond') AS due
    FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::timestamptz[], $6::bigint[], $7::int[],
                $8::bigint[], $9::text[], $10::text[], $11::bool[], $12::text[], $13::timestamptz[],
                $14::text[], $15::text[], $16::text[])
         WITH ORDINALITY AS i(kind, key, bucket, priority, run_at, delay_us, max_attempts,
                              timeout_ms, payload, unique_key, pending, schedule, scheduled_for,
                              limit_key, resources, metadata, ord)
), ins AS (
    INSERT INTO flotilla_tasks (kind, key, bucket, status, priority, run_at, max_attempts, timeout_ms,
                                payload, unique_key, schedule, scheduled_for, created_at, updated_at,
                                limit_key, resources, metadata)
    SELECT kind, key, bucket,
           CASE WHEN pending THEN 'pending'
                WHEN due > statement_timestamp() THEN 'scheduled'
                ELSE 'queued' END,
           priority, greatest(due, statement_timestamp()), max_attempts, timeout_ms,
           payload::jsonb, unique_key, schedule, scheduled_for, statement_timestamp(), statement_timestamp(),
           limit_key, resources::jsonb, metadata::jsonb
    FROM input
    ORDER BY ord`

var insertTasksTail = `
    RETURNING ` + taskColumns + `
), ` + bucketSetNotifySQL("notified", string(store.TopicTasks), `SELECT bucket FROM ins WHERE status = 'queued'`) + `
SELECT ` + taskColumns + ` FROM ins, (SELECT count(*) FROM notified) n
ORDER BY id`

// insertTasksQuietSQL creates tasks without announcing them, for callers
// that announce after the commit (see CreateTasks).
var insertTasksQuietSQL = insertTasksHead + `
    RETURNING ` + taskColumns + `
)
SELECT ` + taskColumns + ` FROM ins ORDER BY id`

var (
	// insertTasksSQL creates tasks and, in the same statement, announces
	// the buckets of those that are due now.
	insertTasksSQL = insertTasksHead + insertTasksTail
	// insertTasksSkipConflictSQL is insertTasksSQL for a schedule's tick:
	// a task already created for the tick (or an unfinished one with the
	// same unique key) means there is nothing to create.
	insertTasksSkipConflictSQL = insertTasksHead + `
    ON CONFLICT DO NOTHING` + insertTasksTail
)

// taskBatch is a batch of NewTasks as the column arrays of insertTasksSQL.
type taskBatch struct {
	kinds, keys, payloads, uniqueKeys, schedules []string
	uniqueValid, scheduleValid                   []bool
	buckets, priorities, maxAttempts             []int32
	runAts, scheduledFor                         []pgtype.Timestamptz
	delays, timeouts                             []int64
	pending                                      []bool
	limitKeys                                    []string
	resources, metadata                          []pgtype.Text
}

func (b *taskBatch) args() []any {
	texts := func(vals []string, valid []bool) []pgtype.Text {
		out := make([]pgtype.Text, len(vals))
		for i := range vals {
			out[i] = pgtype.Text{String: vals[i], Valid: valid[i]}
		}
		return out
	}
	return []any{
		b.kinds, b.keys, b.buckets, b.priorities, b.runAts, b.delays, b.maxAttempts, b.timeouts,
		b.payloads, texts(b.uniqueKeys, b.uniqueValid), b.pending,
		texts(b.schedules, b.scheduleValid), b.scheduledFor, b.limitKeys, b.resources, b.metadata,
	}
}

func maxAttemptsOf(nt store.NewTask) int {
	if nt.MaxAttempts == 0 {
		return store.DefaultMaxAttempts
	}
	return nt.MaxAttempts
}

func newTaskBatch(tasks []store.NewTask) *taskBatch {
	n := len(tasks)
	b := &taskBatch{
		kinds: make([]string, n), keys: make([]string, n), payloads: make([]string, n),
		uniqueKeys: make([]string, n), schedules: make([]string, n),
		uniqueValid: make([]bool, n), scheduleValid: make([]bool, n),
		buckets: make([]int32, n), priorities: make([]int32, n), maxAttempts: make([]int32, n),
		runAts: make([]pgtype.Timestamptz, n), scheduledFor: make([]pgtype.Timestamptz, n),
		delays: make([]int64, n), timeouts: make([]int64, n), pending: make([]bool, n),
		limitKeys: make([]string, n), resources: make([]pgtype.Text, n), metadata: make([]pgtype.Text, n),
	}
	for i, nt := range tasks {
		b.kinds[i], b.keys[i] = nt.Kind, nt.Key
		b.payloads[i] = jsonOrNull(nt.Payload)
		b.uniqueKeys[i], b.uniqueValid[i] = nt.UniqueKey, nt.UniqueKey != ""
		b.schedules[i], b.scheduleValid[i] = nt.Schedule, nt.Schedule != ""
		b.buckets[i], b.priorities[i] = int32(nt.Bucket), int32(nt.Priority)
		b.maxAttempts[i] = int32(maxAttemptsOf(nt))
		b.runAts[i] = optTimestamp(nt.RunAt)
		b.scheduledFor[i] = optTimestamp(nt.ScheduledFor)
		b.delays[i] = micros(nt.Delay)
		b.timeouts[i] = nt.Timeout.Milliseconds()
		b.pending[i] = nt.Pending
		b.limitKeys[i] = nt.LimitKey
		b.resources[i] = resourcesText(nt.Resources)
		b.metadata[i] = metadataText(nt.Metadata)
	}
	return b
}

// CreateTasks inserts tasks atomically and returns them in input order. It
// announces, on TopicTasks, the buckets of those that are due now.
func (s *Store) CreateTasks(ctx context.Context, tasks []store.NewTask) ([]*task.Task, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	if err := s.validate(ctx, tasks); err != nil {
		return nil, err
	}
	if len(tasks) < copyThreshold {
		out, err := s.insertThenAnnounce(ctx, tasks)
		return out, s.nameDuplicate(ctx, tasks, err)
	}
	var out []*task.Task
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = copyTasks(ctx, tx, tasks)
		return err
	})
	return out, s.nameDuplicate(ctx, tasks, err)
}

// holderSQL finds the task holding a new task's unique key, or fired for
// its schedule tick, through the unique indexes.
const holderSQL = `SELECT id FROM flotilla_tasks
WHERE (unique_key = $1 AND status NOT IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped'))
   OR (schedule = $2 AND scheduled_for = $3)
ORDER BY id LIMIT 1`

// nameDuplicate turns a collision of tasks with a unique index into the
// store's *store.DuplicateError, which names the task that holds the key
// (read on the pool: the failed transaction can read nothing more); other
// errors are returned as they are.
func (s *Store) nameDuplicate(ctx context.Context, tasks []store.NewTask, err error) error {
	if !errors.Is(err, store.ErrDuplicate) {
		return err
	}
	return store.FindDuplicate(tasks, 0, len(tasks), func(nt store.NewTask) (int64, error) {
		var id int64
		err := s.pool.QueryRow(ctx, holderSQL, optText(nt.UniqueKey), optText(nt.Schedule), optTimestamp(nt.ScheduledFor)).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return id, wrap(err, "read the task holding a unique key")
	})
}

// CreateTasksTx is CreateTasks inside the caller's transaction: the tasks
// exist, and their notification is delivered, only if and when tx commits.
// An error leaves tx to the caller, who must roll it back.
func (s *Store) CreateTasksTx(ctx context.Context, tx pgx.Tx, tasks []store.NewTask) ([]*task.Task, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	if err := s.validate(ctx, tasks); err != nil {
		return nil, err
	}
	var (
		out []*task.Task
		err error
	)
	if len(tasks) < copyThreshold {
		out, err = insertTasks(ctx, tx, tasks)
	} else {
		out, err = copyTasks(ctx, tx, tasks)
	}
	return out, s.nameDuplicate(ctx, tasks, err)
}

func (s *Store) validate(ctx context.Context, tasks []store.NewTask) error {
	n, err := s.fleetSize(ctx)
	if err != nil {
		return err
	}
	return store.CheckNewTasks(tasks, n)
}

// insertThenAnnounce creates a small batch and announces the buckets of
// its due tasks, in one round trip: the insert in a transaction of its own
// (BEGIN, the insert, COMMIT), then the NOTIFY in the next, sent together.
// PostgreSQL serialises the commits of transactions that notify (a lock on
// the notification queue held through the commit), so a NOTIFY inside the
// insert would queue every concurrent submitter behind one another's insert
// commit; the notify-only transaction's commit is a short one (it gives the
// transaction an id and a commit record, but writes no row). Sending both
// at once spares the submitter a round trip and has the notification leave as soon as the
// insert has committed, not once the submitter has heard so.
//
// Only tasks due by any clock near ours are announced that way (see
// surelyDue): the others are queued or not by the database's clock, and are
// announced after the answer, once it says so. A notification whose insert
// failed is not sent: the server skips the rest of the batch after an
// error.
func (s *Store) insertThenAnnounce(ctx context.Context, tasks []store.NewTask) ([]*task.Task, error) {
	now := time.Now()
	var sure []int
	for _, nt := range tasks {
		if surelyDue(nt, now) {
			sure = append(sure, nt.Bucket)
		}
	}
	sureSet := bucket.Of(sure...).String()
	var (
		out       []*task.Task
		committed bool
	)
	err := s.batchedTx(ctx, func(conn *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		// The insert reads no table, only its parameter arrays, so no
		// statistics can make its generic plan wrong; planning it for each
		// submission cost 0.16 ms, more than the 0.10 ms of running it.
		b.Queue(genericPlanSQL)
		b.Queue(insertTasksQuietSQL, newTaskBatch(tasks).args()...).Query(func(rows pgx.Rows) error {
			var err error
			out, err = scanTasks(rows)
			return err
		})
		b.Queue("COMMIT").Exec(func(pgconn.CommandTag) error {
			committed = true
			return nil
		})
		if len(sure) > 0 {
			b.Queue(notifyTasksSQL, sureSet)
		}
		return conn.SendBatch(ctx, b).Close()
	})
	// Once the insert has committed the tasks exist, whatever became of
	// the notification: it is a hint, and nodes poll.
	if err != nil && !committed {
		return nil, createError(err, len(tasks))
	}
	if err := completeInserted(tasks, out); err != nil {
		return nil, err
	}
	var late []int
	for i, t := range out {
		if t.Status == task.Queued && !surelyDue(tasks[i], now) {
			late = append(late, t.Bucket)
		}
	}
	if len(sure) > 0 {
		s.deliverLocally(store.TopicTasks, sureSet)
	}
	s.announce(ctx, late)
	return out, nil
}

// clockTrust is how far the database's clock may be behind this process's
// for surelyDue to hold.
const clockTrust = time.Minute

// surelyDue reports whether a new task will be queued at once, read from
// this process's clock now: it has no delay and no dependency, and no run
// time of its own or one over clockTrust ago. Should the database's clock
// be further behind, such a task is scheduled, and its bucket was
// announced for nothing: a hint that a claim finds nothing behind.
func surelyDue(nt store.NewTask, now time.Time) bool {
	return nt.Delay <= 0 && !nt.Pending && (nt.RunAt.IsZero() || nt.RunAt.Before(now.Add(-clockTrust)))
}

// insertTasks creates a batch in one statement (an implicit transaction on
// the pool), its notification included.
func insertTasks(ctx context.Context, q querier, tasks []store.NewTask) ([]*task.Task, error) {
	return insertTasksWith(ctx, q, insertTasksSQL, tasks)
}

func insertTasksWith(ctx context.Context, q querier, sql string, tasks []store.NewTask) ([]*task.Task, error) {
	rows, err := q.Query(ctx, sql, newTaskBatch(tasks).args()...)
	if err != nil {
		return nil, createError(err, len(tasks))
	}
	out, err := scanTasks(rows)
	if err != nil {
		return nil, createError(err, len(tasks))
	}
	if err := completeInserted(tasks, out); err != nil {
		return nil, err
	}
	return out, nil
}

// completeInserted checks that an insert returned one task per input, and
// gives each what its row was not read back with.
func completeInserted(tasks []store.NewTask, out []*task.Task) error {
	if len(out) != len(tasks) {
		return fmt.Errorf("create %d tasks: %d were returned", len(tasks), len(out))
	}
	for i, t := range out { // in input order, and the insert returns what it was given
		t.LimitKey, t.Resources = tasks[i].LimitKey, maps.Clone(tasks[i].Resources)
	}
	return nil
}

const reserveIDsSQL = `
SELECT statement_timestamp(), array_agg(nextval('flotilla_tasks_id_seq'))
FROM generate_series(1, $1::int)`

const notifyTasksSQL = `SELECT pg_notify('flotilla_tasks', $1)`

// copyColumns are the columns copyTasks writes; the rest take their
// defaults.
var copyColumns = []string{
	"id", "kind", "key", "bucket", "status", "priority", "run_at", "max_attempts", "timeout_ms",
	"payload", "unique_key", "schedule", "scheduled_for", "created_at", "updated_at", "limit_key", "resources",
	"metadata",
}

// copyTasks creates a large batch inside tx: one statement reserves the ids
// and reads the database clock, COPY loads the rows, and one notification
// names the buckets of the tasks due now. Statuses are decided with the
// database's clock as read by the first statement.
func copyTasks(ctx context.Context, tx pgx.Tx, tasks []store.NewTask) ([]*task.Task, error) {
	var (
		now time.Time
		ids []int64
	)
	if err := tx.QueryRow(ctx, reserveIDsSQL, len(tasks)).Scan(&now, &ids); err != nil {
		return nil, wrap(err, "reserve %d task ids", len(tasks))
	}
	slices.Sort(ids)
	now = now.UTC()

	out := make([]*task.Task, len(tasks))
	rows := make([][]any, len(tasks))
	var due []int
	for i, nt := range tasks {
		t := &task.Task{
			ID: ids[i], Kind: nt.Kind, Key: nt.Key, Bucket: nt.Bucket, StatusVersion: 1,
			Priority: nt.Priority, MaxAttempts: maxAttemptsOf(nt),
			Timeout:   time.Duration(nt.Timeout.Milliseconds()) * time.Millisecond,
			Payload:   json.RawMessage(jsonOrNull(nt.Payload)),
			UniqueKey: nt.UniqueKey, Schedule: nt.Schedule,
			ScheduledFor: nt.ScheduledFor.UTC().Truncate(time.Microsecond),
			CreatedAt:    now, UpdatedAt: now,
		}
		if nt.ScheduledFor.IsZero() {
			t.ScheduledFor = time.Time{}
		}
		runAt := nt.RunAt.UTC().Truncate(time.Microsecond)
		if nt.RunAt.IsZero() {
			runAt = now.Add(nt.Delay).Truncate(time.Microsecond)
		}
		switch {
		case nt.Pending:
			t.Status = task.Pending
		case runAt.After(now):
			t.Status = task.Scheduled
		default:
			t.Status = task.Queued
			due = append(due, nt.Bucket)
		}
		t.RunAt = runAt
		if !runAt.After(now) {
			t.RunAt = now
		}
		rows[i] = []any{
			t.ID, t.Kind, t.Key, int32(t.Bucket), string(t.Status), int32(t.Priority), t.RunAt,
			int32(t.MaxAttempts), nt.Timeout.Milliseconds(), []byte(t.Payload), optText(nt.UniqueKey),
			optText(nt.Schedule), optTimestamp(t.ScheduledFor), now, now, nt.LimitKey, resourcesJSON(nt.Resources),
			metadataJSON(nt.Metadata),
		}
		t.LimitKey, t.Resources = nt.LimitKey, maps.Clone(nt.Resources)
		t.Metadata = store.NoEmptyMetadata(nt.Metadata)
		out[i] = t
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"flotilla_tasks"}, copyColumns, pgx.CopyFromRows(rows)); err != nil {
		return nil, createError(err, len(tasks))
	}
	if len(due) > 0 {
		if _, err := tx.Exec(ctx, notifyTasksSQL, bucket.Of(due...).String()); err != nil {
			return nil, wrap(err, "announce %d new tasks", len(tasks))
		}
	}
	return out, nil
}

// claimableNow reports whether a task moved to status with delay is due at
// once: such a move makes work for its bucket's holder, like a new task.
func claimableNow(status task.Status, delay time.Duration) bool {
	return status == task.Queued || (status == task.Retrying || status == task.Scheduled) && delay <= 0
}

// announce tells listeners, on TopicTasks, that tasks of buckets became
// claimable, once the move that made them so has committed. It is a hint
// sent after the fact: a failure to send it is not the caller's failure
// (the move happened), and nodes poll anyway, so it is not reported.
func (s *Store) announce(ctx context.Context, buckets []int) {
	if len(buckets) > 0 {
		set := bucket.Of(buckets...).String()
		s.deliverLocally(store.TopicTasks, set)
		_, _ = s.pool.Exec(ctx, notifyTasksSQL, set)
	}
}

// createError names the unique key or schedule tick that a batch collided
// with.
func createError(err error, n int) error {
	if index, value, ok := uniqueViolation(err); ok {
		switch index {
		case uniqueKeyIndex:
			return fmt.Errorf("create %d tasks: unique key %s already names an unfinished task: %w", n, value, store.ErrDuplicate)
		case scheduleTickIndex:
			return fmt.Errorf("create %d tasks: schedule tick (%s) already has its task: %w", n, value, store.ErrDuplicate)
		}
	}
	return wrap(err, "create %d tasks", n)
}

var getTaskSQL = `SELECT ` + taskColumns + `, ` + limitColumns + ` FROM flotilla_tasks WHERE id = $1`

// GetTask reads one task.
func (s *Store) GetTask(ctx context.Context, id int64) (*task.Task, error) {
	t, err := scanLimitedTask(s.pool.QueryRow(ctx, getTaskSQL, id))
	if err != nil {
		return nil, wrap(err, "task %d", id)
	}
	return t, nil
}

// listTasksSQL has every filter optional: a NULL, empty or zero parameter turns
// its condition off, and with custom plans (force_custom_plan) the planner
// drops those conditions before choosing a plan. There are no indexes on
// kind or key: each would cost an index entry on every transition (status
// changes are never HOT updates), and a listing walks the primary key newest
// first and stops at its limit.
var listTasksSQL = `
SELECT ` + taskColumns + `, ` + limitColumns + ` FROM flotilla_tasks
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::int[] IS NULL OR bucket = ANY($2::int[]))
  AND ($3::text = '' OR kind = $3::text)
  AND ($4::text = '' OR key = $4::text)
  AND ($5::text = '' OR schedule = $5::text)
  AND ($6::bigint = 0 OR id < $6::bigint)
  AND ($8::text = '' OR node = $8::text)
  AND ($9::jsonb IS NULL OR payload @> $9::jsonb)
ORDER BY id DESC
LIMIT $7`

// DefaultListLimit is the number of tasks ListTasks returns when the filter
// sets no limit.
const DefaultListLimit = 100

// ListTasks returns tasks newest first.
func (s *Store) ListTasks(ctx context.Context, f store.TaskFilter) ([]*task.Task, error) {
	var statuses, buckets any
	if f.Statuses != nil {
		list := make([]string, len(f.Statuses))
		for i, st := range f.Statuses {
			if !st.Valid() {
				return nil, fmt.Errorf("list tasks: unknown status %q: %w", st, store.ErrInvalid)
			}
			list[i] = string(st)
		}
		statuses = list
	}
	if f.Buckets != nil {
		list := make([]int32, 0, f.Buckets.Len())
		for _, b := range f.Buckets.Slice() {
			list = append(list, int32(b))
		}
		buckets = list
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	var payload any
	if f.Payload != nil {
		if !json.Valid(f.Payload) {
			return nil, fmt.Errorf("list tasks: payload filter %s is not valid JSON; give a JSON value such as {\"customer\": 7}: %w", f.Payload, store.ErrInvalid)
		}
		payload = string(f.Payload)
	}
	rows, err := s.pool.Query(ctx, listTasksSQL, statuses, buckets, f.Kind, f.Key, f.Schedule, f.BeforeID, limit,
		f.Node, payload)
	if err != nil {
		return nil, wrap(err, "list tasks")
	}
	out, err := scanLimitedTasks(rows)
	if err != nil {
		return nil, wrap(err, "list tasks")
	}
	return out, nil
}

// taskEventsSQL reads the trail in one snapshot. The creation event is not
// stored: it is made from the task row, and the state the task was created
// in is where its second event starts (or its state now, if it has none).
const taskEventsSQL = `
WITH t AS (
    SELECT id, status, created_at FROM flotilla_tasks WHERE id = $1
), ev AS (
    SELECT e.seq, e.from_status, e.to_status, e.at, e.node, e.epoch, e.attempt, e.reason, e.error
    FROM flotilla_task_events e
    WHERE e.task_id = $1 AND EXISTS (SELECT 1 FROM t)
)
SELECT 1::bigint, ''::text, coalesce((SELECT from_status FROM ev WHERE seq = 2), t.status),
       t.created_at, ''::text, 0::bigint, 0::int,
       -- A task that runs another again says so, and who asked (RetryTask).
       coalesce((SELECT r.reason FROM flotilla_task_retries r WHERE r.retry_id = $1), 'created'), ''::text
FROM t
UNION ALL
SELECT seq, from_status, to_status, at, node, epoch, attempt, reason, error FROM ev
ORDER BY 1`

// TaskEvents returns a task's audit trail, creation first.
func (s *Store) TaskEvents(ctx context.Context, id int64) ([]task.Event, error) {
	rows, err := s.pool.Query(ctx, taskEventsSQL, id)
	if err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	defer rows.Close()
	var out []task.Event
	for rows.Next() {
		ev := task.Event{TaskID: id}
		var (
			from, to string
			attempt  int32
		)
		if err := rows.Scan(&ev.Seq, &from, &to, &ev.At, &ev.Node, &ev.Epoch, &attempt, &ev.Reason, &ev.Error); err != nil {
			return nil, wrap(err, "events of task %d", id)
		}
		ev.From, ev.To, ev.Attempt, ev.At = task.Status(from), task.Status(to), int(attempt), ev.At.UTC()
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "events of task %d", id)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("events of task %d: %w", id, store.ErrNotFound)
	}
	return out, nil
}

// transitionSQL is Transition in one statement: lock the row, check
// version, guard and table, move it and write the event; the last SELECT
// answers what it found, so that a refusal can be explained without
// another round trip. No row at all means there is no such task.
var transitionSQL = `
WITH RECURSIVE cur AS (
    SELECT t.id, t.status AS old_status, t.status_version AS old_version,
           (NOT $9::bool OR EXISTS (
                SELECT 1 FROM flotilla_bucket_leases l
                WHERE l.bucket = t.bucket AND l.owner = $10::text AND l.epoch = $11::bigint
                  AND l.expires_at > statement_timestamp())) AS guard_ok,
           ` + stopDestinationSQL(resumeDestinationSQL("$3::text")) + ` AS dest,
           $5::text AS err, $8::bigint AS delay_us
    FROM flotilla_tasks t
    WHERE t.id = $1
    FOR UPDATE OF t
), c AS (
    SELECT cur.*, ` + movedAllowedSQL("cur.old_status", "cur.dest", "$3::text", "$12", "$13") + ` AS allowed
    FROM cur
), moved AS (
    UPDATE flotilla_tasks t SET ` + transitionSetSQL + `
    FROM c
    WHERE t.id = c.id AND c.old_version = $2 AND c.guard_ok AND c.allowed
    RETURNING ` + taskColumnsOf("t") + `, c.old_status, $6::text AS ev_node, $4::text AS reason, c.err
), ev AS (
    ` + eventInsertSQL(`(SELECT id, status_version, old_status, status, ev_node, $7::bigint AS epoch, attempt, reason, err FROM moved) m`) + `
), ` + ackLeftSQL("moved") + `, ` + resolveSQL(`SELECT id, status, pipeline_id, ev_node, $7::bigint AS epoch FROM moved`) + `
SELECT c.old_status, c.old_version, c.guard_ok, c.dest, c.allowed, m.id IS NOT NULL,
       ` + taskColumnsOf("m") + `, (SELECT array_agg(DISTINCT bucket) FROM released WHERE status = 'queued')
FROM c LEFT JOIN moved m ON true`

// lockTaskSQL and lockTaskNoWaitSQL lock the task a transition moves, in a
// statement before transitionSQL, so that transitionSQL's snapshot is taken
// once the row is held: a stop committed while the move waited for the row
// is then seen by its acknowledgements too. The NOWAIT form fails at once
// with lock_not_available, which wrap turns into store.ErrBusy.
const (
	lockTaskSQL       = `SELECT id FROM flotilla_tasks WHERE id = $1 FOR UPDATE`
	lockTaskNoWaitSQL = `SELECT id FROM flotilla_tasks WHERE id = $1 FOR UPDATE NOWAIT`
)

// Transition moves one task by compare-and-set on its status_version.
func (s *Store) Transition(ctx context.Context, tr store.Transition) (*task.Task, error) {
	if !tr.To.Valid() {
		return nil, fmt.Errorf("task %d: unknown status %q: %w", tr.ID, tr.To, store.ErrInvalid)
	}
	if tr.To == task.Running {
		// A running task needs an owner, a lease and a claim_seq: only
		// ClaimTasks makes one.
		return nil, fmt.Errorf("task %d: a task becomes running only by being claimed: %w", tr.ID, store.ErrInvalid)
	}
	guard, guardOwner, guardEpoch := false, "", int64(0)
	if tr.Guard != nil {
		guard, guardOwner, guardEpoch = true, tr.Guard.Owner, tr.Guard.Epoch
	}
	var (
		oldStatus, dest           string
		oldVersion                int64
		guardOK, allowed, applied bool
		r                         taskRow
		m                         nullableTaskRow
	)
	var releasedIn []int32
	dst := append([]any{&oldStatus, &oldVersion, &guardOK, &dest, &allowed, &applied}, m.dest()...)
	dst = append(dst, &releasedIn)
	lock := lockTaskSQL
	if tr.NoWait {
		lock = lockTaskNoWaitSQL
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lock, tr.ID)
	b.Queue(transitionSQL, tr.ID, tr.Version, string(tr.To), tr.Reason, tr.Error, tr.Node, tr.Epoch, micros(tr.Delay),
		guard, guardOwner, guardEpoch, allowedFrom, allowedTo)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	err := readTransition(br, dst)
	// On an error the connection is left in a failed transaction, and the
	// pool closes it rather than reuse it.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, wrap(err, "task %d", tr.ID)
	}
	switch {
	case applied:
		m.into(&r)
		t := r.task()
		due := ints(releasedIn)
		if claimableNow(t.Status, tr.Delay) {
			due = append(due, t.Bucket)
		}
		s.announce(ctx, due)
		return t, nil
	case oldVersion != tr.Version:
		return nil, fmt.Errorf("task %d is at status_version %d, not %d: %w", tr.ID, oldVersion, tr.Version, store.ErrConflict)
	case !guardOK:
		return nil, fmt.Errorf("task %d: %s does not hold its bucket under epoch %d: %w",
			tr.ID, guardOwner, guardEpoch, store.ErrFenced)
	case !allowed:
		return nil, &task.TransitionError{ID: tr.ID, From: task.Status(oldStatus), To: task.Status(dest)}
	default:
		return nil, errors.New("transition: the statement neither applied nor refused the move")
	}
}

// readTransition reads transitionSQL's answer from its batch. A task that
// does not exist has no row to lock: pgx.ErrNoRows.
func readTransition(br pgx.BatchResults, dst []any) error {
	if _, err := br.Exec(); err != nil { // BEGIN
		return err
	}
	tag, err := br.Exec() // the lock
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return pgx.ErrNoRows
	}
	if err := br.QueryRow().Scan(dst...); err != nil {
		return err
	}
	_, err = br.Exec() // COMMIT
	return err
}

// nullableTaskRow receives taskColumns from an outer join, where every
// column may be NULL.
type nullableTaskRow struct {
	id, statusVersion, timeoutMS, claimSeq, epoch pgtype.Int8
	kind, key, status, errText, node              pgtype.Text
	bucket, priority, attempt, maxAttempts        pgtype.Int4
	payload, result, progress, metadata           []byte
	owner, schedule, uniqueKey                    pgtype.Text
	runAt, createdAt, updatedAt                   pgtype.Timestamptz
	leaseExpiresAt, scheduledFor                  pgtype.Timestamptz
	startedAt, finishedAt                         pgtype.Timestamptz
	stopRequested, pauseRequested                 pgtype.Bool
	pipeline                                      pgtype.Int8
	step                                          pgtype.Text
}

func (n *nullableTaskRow) dest() []any {
	return []any{
		&n.id, &n.kind, &n.key, &n.bucket, &n.status, &n.statusVersion, &n.priority, &n.runAt, &n.attempt,
		&n.maxAttempts, &n.timeoutMS, &n.payload, &n.result, &n.progress, &n.errText, &n.claimSeq, &n.owner, &n.node,
		&n.epoch, &n.leaseExpiresAt, &n.schedule, &n.scheduledFor, &n.uniqueKey, &n.createdAt, &n.startedAt,
		&n.finishedAt, &n.updatedAt, &n.stopRequested, &n.pauseRequested, &n.pipeline, &n.step, &n.metadata,
	}
}

func (n *nullableTaskRow) into(r *taskRow) {
	*r = taskRow{
		id: n.id.Int64, statusVersion: n.statusVersion.Int64, timeoutMS: n.timeoutMS.Int64,
		claimSeq: n.claimSeq.Int64, epoch: n.epoch.Int64,
		kind: n.kind.String, key: n.key.String, status: n.status.String, errText: n.errText.String, node: n.node.String,
		bucket: n.bucket.Int32, priority: n.priority.Int32, attempt: n.attempt.Int32, maxAttempts: n.maxAttempts.Int32,
		payload: n.payload, result: n.result, progress: n.progress,
		owner: n.owner, schedule: n.schedule, uniqueKey: n.uniqueKey,
		runAt: n.runAt.Time, createdAt: n.createdAt.Time, updatedAt: n.updatedAt.Time,
		leaseExpiresAt: n.leaseExpiresAt, scheduledFor: n.scheduledFor,
		startedAt: n.startedAt, finishedAt: n.finishedAt,
		stopRequested: n.stopRequested.Bool, pauseRequested: n.pauseRequested.Bool,
		pipeline: n.pipeline, step: n.step, metadata: n.metadata,
	}
}
