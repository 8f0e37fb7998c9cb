package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const scheduleColumns = `name, spec, timezone, catch_up, kind, key, bucket, payload, priority, max_attempts,
    timeout_ms, enabled, next_fire_at, last_fire_at, created_at, updated_at`

const insertScheduleSQL = `
INSERT INTO flotilla_schedules (name, spec, timezone, catch_up, kind, key, bucket, payload, priority,
    max_attempts, timeout_ms, enabled, next_fire_at, last_fire_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14,
        statement_timestamp(), statement_timestamp())`

// upsertScheduleSQL replaces a schedule of the same name but keeps its
// creation time and its last firing.
const upsertScheduleSQL = insertScheduleSQL + `
ON CONFLICT (name) DO UPDATE SET
    spec = excluded.spec, timezone = excluded.timezone, catch_up = excluded.catch_up, kind = excluded.kind,
    key = excluded.key, bucket = excluded.bucket, payload = excluded.payload, priority = excluded.priority,
    max_attempts = excluded.max_attempts, timeout_ms = excluded.timeout_ms, enabled = excluded.enabled,
    next_fire_at = excluded.next_fire_at, updated_at = excluded.updated_at`

// UpsertSchedule creates a schedule, or replaces one of the same name when
// replace is set (store.ErrDuplicate otherwise).
func (s *Store) UpsertSchedule(ctx context.Context, sc store.Schedule, replace bool) (store.Schedule, error) {
	if err := s.checkSchedule(ctx, sc); err != nil {
		return store.Schedule{}, err
	}
	sql := insertScheduleSQL
	if replace {
		sql = upsertScheduleSQL
	}
	_, err := s.pool.Exec(ctx, sql, sc.Name, sc.Spec, sc.Timezone, sc.CatchUp, sc.Kind, sc.Key, int32(sc.Bucket),
		jsonOrNull(sc.Payload), int32(sc.Priority), int32(sc.MaxAttempts), sc.Timeout.Milliseconds(), sc.Enabled,
		sc.NextFireAt, optTimestamp(sc.LastFireAt))
	if err != nil {
		if _, _, dup := uniqueViolation(err); dup {
			return store.Schedule{}, fmt.Errorf("schedule %s already exists: %w", sc.Name, store.ErrDuplicate)
		}
		return store.Schedule{}, wrap(err, "save schedule %s", sc.Name)
	}
	return s.GetSchedule(ctx, sc.Name)
}

// checkSchedule refuses a definition no store could keep. The spec itself
// is package schedule's to parse.
func (s *Store) checkSchedule(ctx context.Context, sc store.Schedule) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("schedule %q: %s: %w", sc.Name, fmt.Sprintf(format, args...), store.ErrInvalid)
	}
	switch {
	case sc.Name == "":
		return fmt.Errorf("schedule: no name: %w", store.ErrInvalid)
	case sc.Spec == "":
		return bad("no spec")
	case sc.Kind == "":
		return bad("no task kind")
	case sc.CatchUp != "" && sc.CatchUp != store.CatchUpSkip && sc.CatchUp != store.CatchUpLatest:
		return bad("unknown catch-up policy %q: valid policies are %s and %s", sc.CatchUp, store.CatchUpSkip, store.CatchUpLatest)
	case sc.MaxAttempts < 0:
		return bad("max attempts %d is negative", sc.MaxAttempts)
	case sc.Timeout < 0:
		return bad("timeout %v is negative", sc.Timeout)
	case sc.Priority < math.MinInt32 || sc.Priority > math.MaxInt32:
		return bad("priority %d is out of range", sc.Priority)
	case !validJSON(sc.Payload):
		return bad("payload is not valid JSON")
	case sc.NextFireAt.IsZero():
		return bad("no next fire time")
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return err
	}
	if sc.Bucket < 0 || sc.Bucket >= n {
		return bad("bucket %d does not exist: this fleet has buckets 0-%d", sc.Bucket, n-1)
	}
	return nil
}

const getScheduleSQL = `SELECT ` + scheduleColumns + ` FROM flotilla_schedules WHERE name = $1`

// GetSchedule reads one schedule.
func (s *Store) GetSchedule(ctx context.Context, name string) (store.Schedule, error) {
	sc, err := scanSchedule(s.pool.QueryRow(ctx, getScheduleSQL, name))
	if err != nil {
		return store.Schedule{}, wrap(err, "schedule %s", name)
	}
	return sc, nil
}

const listSchedulesSQL = `SELECT ` + scheduleColumns + ` FROM flotilla_schedules ORDER BY name`

// ListSchedules returns every schedule by name.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	return s.querySchedules(ctx, "list schedules", listSchedulesSQL)
}

const deleteScheduleSQL = `DELETE FROM flotilla_schedules WHERE name = $1`

// DeleteSchedule removes a schedule. The tasks it fired stay.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	tag, err := s.pool.Exec(ctx, deleteScheduleSQL, name)
	if err != nil {
		return wrap(err, "delete schedule %s", name)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delete schedule %s: %w", name, store.ErrNotFound)
	}
	return nil
}

const setScheduleEnabledSQL = `
UPDATE flotilla_schedules SET enabled = $2, updated_at = statement_timestamp()
WHERE name = $1
RETURNING ` + scheduleColumns

// SetScheduleEnabled pauses or resumes a schedule.
func (s *Store) SetScheduleEnabled(ctx context.Context, name string, enabled bool) (store.Schedule, error) {
	sc, err := scanSchedule(s.pool.QueryRow(ctx, setScheduleEnabledSQL, name, enabled))
	if err != nil {
		return store.Schedule{}, wrap(err, "schedule %s", name)
	}
	return sc, nil
}

const dueSchedulesSQL = `
SELECT ` + scheduleColumns + ` FROM flotilla_schedules
WHERE enabled AND bucket = ANY($1::int[]) AND next_fire_at <= statement_timestamp()
ORDER BY next_fire_at, name
LIMIT $2`

// DueSchedules lists enabled schedules in buckets whose next fire time has
// passed by the database clock, earliest first.
func (s *Store) DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]store.Schedule, error) {
	if buckets.Empty() {
		return nil, nil
	}
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	return s.querySchedules(ctx, "due schedules", dueSchedulesSQL, bucketArray(buckets), limit)
}

func (s *Store) querySchedules(ctx context.Context, what, sql string, args ...any) ([]store.Schedule, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap(err, "%s", what)
	}
	defer rows.Close()
	var out []store.Schedule
	for rows.Next() {
		sc, err := scanSchedule(rows)
		if err != nil {
			return nil, wrap(err, "%s", what)
		}
		out = append(out, sc)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "%s", what)
	}
	return out, nil
}

func scanSchedule(row pgx.Row) (store.Schedule, error) {
	var (
		sc                               store.Schedule
		b, priority, maxAttempts         int32
		timeoutMS                        int64
		payload                          []byte
		lastFireAt                       pgtype.Timestamptz
		nextFireAt, createdAt, updatedAt time.Time
	)
	if err := row.Scan(&sc.Name, &sc.Spec, &sc.Timezone, &sc.CatchUp, &sc.Kind, &sc.Key, &b, &payload, &priority,
		&maxAttempts, &timeoutMS, &sc.Enabled, &nextFireAt, &lastFireAt, &createdAt, &updatedAt); err != nil {
		return store.Schedule{}, err
	}
	sc.Bucket, sc.Priority, sc.MaxAttempts = int(b), int(priority), int(maxAttempts)
	sc.Timeout = time.Duration(timeoutMS) * time.Millisecond
	sc.Payload = rawJSON(payload)
	sc.NextFireAt, sc.CreatedAt, sc.UpdatedAt = nextFireAt.UTC(), createdAt.UTC(), updatedAt.UTC()
	sc.LastFireAt = optTime(lastFireAt)
	return sc, nil
}

// checkScheduleLeaseSQL finds the schedule and says whether req's owner
// holds its bucket, unexpired, under req's epoch. FOR SHARE on the lease row
// keeps the lease from changing hands until the firing commits.
const checkScheduleLeaseSQL = `
SELECT s.bucket, EXISTS (
    SELECT 1 FROM flotilla_bucket_leases l
    WHERE l.bucket = s.bucket AND l.owner = $2 AND l.epoch = $3 AND l.expires_at > statement_timestamp()
    FOR SHARE)
FROM flotilla_schedules s
WHERE s.name = $1`

// advanceScheduleSQL moves the schedule on by compare-and-set: a schedule
// that was advanced, or paused, since the caller read it is left alone.
const advanceScheduleSQL = `
UPDATE flotilla_schedules SET next_fire_at = $3, last_fire_at = $2, updated_at = statement_timestamp()
WHERE name = $1 AND next_fire_at = $2 AND enabled`

// firedTaskSQL finds the task that kept a tick from creating its own: the
// tick's, or the unfinished task holding its unique key.
var firedTaskSQL = `
(SELECT ` + taskColumns + ` FROM flotilla_tasks WHERE schedule = $1 AND scheduled_for = $2)
UNION ALL
(SELECT ` + taskColumns + ` FROM flotilla_tasks
 WHERE $3 <> '' AND unique_key = $3 AND status NOT IN ` + terminalStatusesSQL + `)
LIMIT 1`

// FireSchedule creates the task of one tick and advances the schedule, in
// one transaction, while req.Owner holds the schedule's bucket under
// req.Epoch.
//
// A tick whose task already exists (the unique schedule/scheduled_for index)
// is "already fired": fired is false, the task returned is that one, and the
// schedule advances all the same. So is a tick whose task would collide with
// an unfinished task of the same unique key, which is returned: a periodic
// task that is still running is not queued a second time.
func (s *Store) FireSchedule(ctx context.Context, req store.FireRequest) (*task.Task, bool, error) {
	nt := req.Task
	nt.Schedule, nt.ScheduledFor, nt.Pending = req.Name, req.ScheduledFor, false
	if req.ScheduledFor.IsZero() {
		return nil, false, fmt.Errorf("fire schedule %s: no tick: %w", req.Name, store.ErrInvalid)
	}
	if !req.Next.After(req.ScheduledFor) {
		// A schedule that does not move forward would fire the same tick
		// for ever.
		return nil, false, fmt.Errorf("fire schedule %s: next fire time %s is not after the tick %s: %w", req.Name,
			req.Next.UTC().Format(time.RFC3339Nano), req.ScheduledFor.UTC().Format(time.RFC3339Nano), store.ErrInvalid)
	}
	if err := s.validate(ctx, []store.NewTask{nt}); err != nil {
		return nil, false, fmt.Errorf("fire schedule %s: %w", req.Name, err)
	}
	var (
		fired *task.Task
		ok    bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			b    int32
			held bool
		)
		if err := tx.QueryRow(ctx, checkScheduleLeaseSQL, req.Name, req.Owner, req.Epoch).Scan(&b, &held); err != nil {
			return wrap(err, "fire schedule %s", req.Name)
		}
		if !held {
			return fmt.Errorf("fire schedule %s: %s does not hold bucket %d under epoch %d: %w",
				req.Name, req.Owner, b, req.Epoch, store.ErrFenced)
		}
		tag, err := tx.Exec(ctx, advanceScheduleSQL, req.Name, req.ScheduledFor, req.Next)
		if err != nil {
			return wrap(err, "advance schedule %s", req.Name)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("fire schedule %s: it was paused, or its next fire time is no longer %s: %w",
				req.Name, req.ScheduledFor.UTC().Format(time.RFC3339Nano), store.ErrConflict)
		}
		rows, err := tx.Query(ctx, insertTasksSkipConflictSQL, newTaskBatch([]store.NewTask{nt}).args()...)
		if err != nil {
			return createError(err, 1)
		}
		created, err := scanTasks(rows)
		if err != nil {
			return createError(err, 1)
		}
		if len(created) == 1 {
			fired, ok = created[0], true
			return nil
		}
		fired, err = scanTask(tx.QueryRow(ctx, firedTaskSQL, req.Name, req.ScheduledFor, nt.UniqueKey))
		if errors.Is(err, pgx.ErrNoRows) {
			// The unique key's holder finished in between (or the tick's
			// task was pruned): nothing to show, and the tick is passed.
			return nil
		}
		return wrap(err, "fire schedule %s", req.Name)
	})
	if err != nil {
		return nil, false, err
	}
	return fired, ok, nil
}
