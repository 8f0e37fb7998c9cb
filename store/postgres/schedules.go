package postgres

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

const scheduleColumns = `name, spec, timezone, catch_up, kind, key, bucket, payload, priority, max_attempts,
    timeout_ms, enabled, next_fire_at, last_fire_at, created_at, updated_at`

const insertScheduleSQL = `
INSERT INTO flotilla_schedules (name, spec, timezone, catch_up, kind, key, bucket, payload, priority,
    max_attempts, timeout_ms, enabled, next_fire_at, last_fire_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14,
        statement_timestamp(), statement_timestamp())`

// upsertScheduleSQL replaces a schedule of the same name but keeps its
// creation time and its last firing, and its next fire time while its
// timing is unchanged: a definition declared again at every node start must
// not move, and so skip, the tick the holder is about to fire. It keeps
// enabled unless $15 says to write it, in the same statement, so that no
// value read before can undo an operator's pause committed since. Resuming
// moves the next fire time up to the one given (the first tick after now),
// as SetScheduleEnabled does, so that the ticks of the pause are not fired.
const upsertScheduleSQL = insertScheduleSQL + `
ON CONFLICT (name) DO UPDATE SET
    spec = excluded.spec, timezone = excluded.timezone, catch_up = excluded.catch_up, kind = excluded.kind,
    key = excluded.key, bucket = excluded.bucket, payload = excluded.payload, priority = excluded.priority,
    max_attempts = excluded.max_attempts, timeout_ms = excluded.timeout_ms,
    enabled = CASE WHEN $15::boolean THEN excluded.enabled ELSE flotilla_schedules.enabled END,
    next_fire_at = CASE
        WHEN flotilla_schedules.spec <> excluded.spec OR flotilla_schedules.timezone <> excluded.timezone
            THEN excluded.next_fire_at
        WHEN $15::boolean AND excluded.enabled AND NOT flotilla_schedules.enabled
            THEN greatest(flotilla_schedules.next_fire_at, excluded.next_fire_at)
        ELSE flotilla_schedules.next_fire_at END,
    updated_at = excluded.updated_at`

// UpsertSchedule creates a schedule, or replaces one of the same name as
// mode says (store.ErrDuplicate for store.UpsertCreate).
func (s *Store) UpsertSchedule(ctx context.Context, sc store.Schedule, mode store.UpsertMode) (store.Schedule, error) {
	if err := mode.Check(); err != nil {
		return store.Schedule{}, err
	}
	if err := s.checkSchedule(ctx, sc); err != nil {
		return store.Schedule{}, err
	}
	sql := insertScheduleSQL
	args := []any{sc.Name, sc.Spec, sc.Timezone, sc.CatchUp, sc.Kind, sc.Key, int32(sc.Bucket),
		jsonOrNull(sc.Payload), int32(sc.Priority), int32(sc.MaxAttempts), sc.Timeout.Milliseconds(), sc.Enabled,
		sc.NextFireAt, optTimestamp(sc.LastFireAt)}
	if mode != store.UpsertCreate {
		sql = upsertScheduleSQL
		args = append(args, mode == store.UpsertReplaceEnabled)
	}
	_, err := s.pool.Exec(ctx, sql, args...)
	if err != nil {
		if _, _, dup := uniqueViolation(err); dup {
			return store.Schedule{}, fmt.Errorf("schedule %s already exists: %w", sc.Name, store.ErrDuplicate)
		}
		return store.Schedule{}, wrap(err, "save schedule %s", sc.Name)
	}
	s.announceSchedule(ctx, sc.Bucket)
	return s.GetSchedule(ctx, sc.Name)
}

// announceSchedule tells the holder of bucket, on TopicSchedules, that a
// schedule of it changed, once the change has committed: a hint, as
// announce's are, whose loss only delays the tick to the holder's next
// look.
func (s *Store) announceSchedule(ctx context.Context, bucket int) {
	payload := strconv.Itoa(bucket)
	s.deliverLocally(store.TopicSchedules, payload)
	_, _ = s.pool.Exec(ctx, notifySchedulesSQL, payload)
}

const notifySchedulesSQL = `SELECT pg_notify('` + string(store.TopicSchedules) + `', $1)`

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
	case store.CheckTimeout(sc.Timeout) != nil:
		return bad("%v", store.CheckTimeout(sc.Timeout))
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
UPDATE flotilla_schedules
SET enabled = $2, updated_at = statement_timestamp(),
    next_fire_at = CASE WHEN $2 AND NOT enabled AND $3::timestamptz IS NOT NULL
                        THEN greatest(next_fire_at, $3) ELSE next_fire_at END
WHERE name = $1
RETURNING ` + scheduleColumns

// SetScheduleEnabled pauses or resumes a schedule; a resumed schedule's next
// fire time moves up to resumeAt, when given, so the ticks of the pause are
// not fired as missed ones.
func (s *Store) SetScheduleEnabled(ctx context.Context, name string, enabled bool, resumeAt time.Time) (store.Schedule, error) {
	sc, err := scanSchedule(s.pool.QueryRow(ctx, setScheduleEnabledSQL, name, enabled, optTimestamp(resumeAt)))
	if err != nil {
		return store.Schedule{}, wrap(err, "schedule %s", name)
	}
	if enabled {
		s.announceSchedule(ctx, sc.Bucket)
	}
	return sc, nil
}

// scheduleReadSettingSQL has the reads every node's schedule loop sends
// (nextScheduleFireSQL, dueSchedulesSQL), every 2.5 s or so when nothing
// is due, run on their generic plans, made without sequential scans: the
// due index, whatever the table held when a connection made them
// (TestTheScheduleLoopsReadsStayOnTheDueIndex). Planning them afresh cost
// 0.2-0.25 ms a read, more than running them.
const scheduleReadSettingSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// nextScheduleFireSQL reads the earliest tick through the due index.
const nextScheduleFireSQL = `
SELECT min(next_fire_at), statement_timestamp() FROM flotilla_schedules
WHERE enabled AND bucket = ANY($1::int[])`

// NextScheduleFire returns the earliest next fire time of the enabled
// schedules in buckets, and the database clock.
func (s *Store) NextScheduleFire(ctx context.Context, buckets bucket.Set) (next, now time.Time, err error) {
	var first pgtype.Timestamptz
	err = s.readOnItsPlan(ctx, scheduleReadSettingSQL, nextScheduleFireSQL, []any{bucketArray(buckets)}, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&first, &now); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil {
		return time.Time{}, time.Time{}, wrap(err, "read the next schedule tick")
	}
	if first.Valid {
		next = first.Time.UTC()
	}
	return next, now.UTC(), nil
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
	var out []store.Schedule
	err := s.readOnItsPlan(ctx, scheduleReadSettingSQL, dueSchedulesSQL, []any{bucketArray(buckets), limit}, func(rows pgx.Rows) error {
		var err error
		out, err = scanSchedules(rows)
		return err
	})
	return out, wrap(err, "due schedules")
}

func (s *Store) querySchedules(ctx context.Context, what, sql string, args ...any) ([]store.Schedule, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap(err, "%s", what)
	}
	out, err := scanSchedules(rows)
	return out, wrap(err, "%s", what)
}

// scanSchedules reads every row of rows, and closes them.
func scanSchedules(rows pgx.Rows) ([]store.Schedule, error) {
	defer rows.Close()
	var out []store.Schedule
	for rows.Next() {
		sc, err := scanSchedule(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, rows.Err()
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

// fireSchedulesSQL advances, by compare-and-set, every requested schedule
// whose bucket the owner holds, unexpired, under the request's epoch, and
// reports each request's fate. The final SELECT reads the schedules as they
// were before the UPDATE (a data-modifying WITH is not visible to its own
// statement), which is what explains a refusal.
//
// The lease rows are not locked: that would hold up the owner's own lease
// renewals for as long as a large firing takes. A lease that expires while
// the transaction runs gives nothing away, because a successor's
// compare-and-set on the same schedule rows waits for this transaction and
// then finds them moved on, and the unique (schedule, scheduled_for) index
// stands behind both.
const fireSchedulesSQL = `
WITH held AS (
    SELECT bucket, epoch FROM flotilla_bucket_leases
    WHERE owner = $1 AND expires_at > statement_timestamp()
), req AS (
    SELECT * FROM unnest($2::text[], $3::bigint[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[])
        AS r(name, epoch, from_at, next_at, scheduled_for)
), moved AS (
    UPDATE flotilla_schedules s
    SET next_fire_at = req.next_at, last_fire_at = coalesce(req.scheduled_for, s.last_fire_at),
        updated_at = statement_timestamp()
    FROM req, held
    WHERE s.name = req.name AND s.enabled AND s.next_fire_at = req.from_at
      AND held.bucket = s.bucket AND held.epoch = req.epoch
    RETURNING s.name
)
SELECT req.name, moved.name IS NOT NULL, s.name IS NOT NULL, coalesce(s.bucket, -1),
       held.epoch IS NOT NULL, coalesce(s.enabled, false), s.next_fire_at
FROM req
LEFT JOIN moved ON moved.name = req.name
LEFT JOIN flotilla_schedules s ON s.name = req.name
LEFT JOIN held ON held.bucket = s.bucket AND held.epoch = req.epoch`

// FireSchedules applies a holder's decisions about its due schedules in one
// transaction of two statements: the first advances every schedule it may,
// the second creates the tasks of the ticks fired. A tick whose task exists
// already (the unique schedule/scheduled_for index), or whose unique key an
// unfinished task holds, is skipped by the insert and reported not fired.
func (s *Store) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	if owner == "" {
		return nil, fmt.Errorf("fire schedules: no owner: %w", store.ErrInvalid)
	}
	if err := store.CheckFireRequests(reqs); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	names, epochs := make([]string, len(reqs)), make([]int64, len(reqs))
	froms, nexts := make([]time.Time, len(reqs)), make([]time.Time, len(reqs))
	ticks := make([]pgtype.Timestamptz, len(reqs))
	index := make(map[string]int, len(reqs))
	var fired []store.NewTask
	for i, r := range reqs {
		names[i], epochs[i], froms[i], nexts[i] = r.Name, r.Epoch, r.From, r.Next
		ticks[i] = pgtype.Timestamptz{Time: r.ScheduledFor, Valid: r.Fire}
		index[r.Name] = i
		if r.Fire {
			nt := r.Task
			nt.Schedule, nt.ScheduledFor, nt.Pending = r.Name, r.ScheduledFor, false
			fired = append(fired, nt)
		}
	}
	if err := s.validate(ctx, fired); err != nil {
		return nil, fmt.Errorf("fire schedules: %w", err)
	}

	var results []store.FireResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		results = make([]store.FireResult, len(reqs)) // a retried function starts afresh
		rows, err := tx.Query(ctx, fireSchedulesSQL, owner, names, epochs, froms, nexts, ticks)
		if err != nil {
			return wrap(err, "fire schedules")
		}
		moved := make(map[string]bool, len(reqs))
		for rows.Next() {
			var (
				name                      string
				ok, exists, held, enabled bool
				b                         int32
				next                      pgtype.Timestamptz
			)
			if err := rows.Scan(&name, &ok, &exists, &b, &held, &enabled, &next); err != nil {
				rows.Close()
				return wrap(err, "fire schedules")
			}
			r := reqs[index[name]]
			switch {
			case ok:
				moved[name] = true
			case !exists:
				results[index[name]].Err = fmt.Errorf("schedule %s: %w", name, store.ErrNotFound)
			case !held:
				results[index[name]].Err = fmt.Errorf("schedule %s: %s does not hold bucket %d under epoch %d: %w",
					name, owner, b, r.Epoch, store.ErrFenced)
			case !enabled:
				results[index[name]].Err = fmt.Errorf("schedule %s is paused: %w", name, store.ErrConflict)
			default:
				results[index[name]].Err = fmt.Errorf("schedule %s: its next fire time is %s, no longer %s: %w", name,
					next.Time.UTC().Format(time.RFC3339Nano), r.From.UTC().Format(time.RFC3339Nano), store.ErrConflict)
			}
		}
		if err := rows.Err(); err != nil {
			return wrap(err, "fire schedules")
		}
		var create []store.NewTask
		for _, nt := range fired {
			if moved[nt.Schedule] {
				create = append(create, nt)
			}
		}
		if len(create) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, insertTasksSkipConflictSQL, newTaskBatch(create).args()...)
		if err != nil {
			return createError(err, len(create))
		}
		created, err := scanTasks(rows)
		if err != nil {
			return createError(err, len(create))
		}
		for _, t := range created {
			results[index[t.Schedule]].Fired, results[index[t.Schedule]].Task = true, t
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}
