package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

const scheduleColumns = `name, spec, timezone, catch_up, kind, key, bucket, payload, priority, max_attempts,
    timeout_ms, enabled, next_fire_at, last_fire_at, created_at, updated_at`

func scanSchedule(row scanner) (store.Schedule, error) {
	var (
		sc                           store.Schedule
		payload                      string
		timeoutMS                    int64
		next, last, created, updated sql.NullInt64
	)
	err := row.Scan(&sc.Name, &sc.Spec, &sc.Timezone, &sc.CatchUp, &sc.Kind, &sc.Key, &sc.Bucket, &payload,
		&sc.Priority, &sc.MaxAttempts, &timeoutMS, &sc.Enabled, &next, &last, &created, &updated)
	if err != nil {
		return store.Schedule{}, err
	}
	sc.Payload = json.RawMessage(payload)
	sc.Timeout = time.Duration(timeoutMS) * time.Millisecond
	sc.NextFireAt, sc.LastFireAt, sc.CreatedAt, sc.UpdatedAt = fromMicros(next), fromMicros(last),
		fromMicros(created), fromMicros(updated)
	return sc, nil
}

func scheduleNotFound(name string) error {
	return fmt.Errorf("schedule %q: %w", name, store.ErrNotFound)
}

// checkSchedule refuses a definition no store could keep, by the rules of
// the PostgreSQL store. The spec itself is package schedule's to parse.
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
	case len(sc.Payload) > 0 && !json.Valid(sc.Payload):
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

func loadSchedule(q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, ctx context.Context, name string) (store.Schedule, error) {
	sc, err := scanSchedule(q.QueryRowContext(ctx, `SELECT `+scheduleColumns+` FROM flotilla_schedules WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Schedule{}, scheduleNotFound(name)
	}
	if err != nil {
		return store.Schedule{}, requireSchema(wrap(err, "read schedule %q", name))
	}
	return sc, nil
}

func (tx *wtx) schedule(name string) (store.Schedule, error) {
	return loadSchedule(tx.conn, tx.ctx, name)
}

const insertScheduleSQL = `INSERT INTO flotilla_schedules (` + scheduleColumns + `)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// upsertScheduleSQL replaces a schedule of the same name but keeps its
// creation time and its last firing, and its next fire time while its
// timing is unchanged: a definition declared again at every node start must
// not move, and so skip, the tick the holder is about to fire. It keeps
// enabled unless the last parameter says to write it, in the same
// statement, as the PostgreSQL store does: the writer's transaction would
// keep a read-then-write safe too, but one statement leaves no read whose
// value could be written back. Resuming moves the next fire time up to the
// one given (the first tick after now), as SetScheduleEnabled does, so that
// the ticks of the pause are not fired.
const upsertScheduleSQL = insertScheduleSQL + `
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, timezone = excluded.timezone,
    catch_up = excluded.catch_up, kind = excluded.kind, key = excluded.key, bucket = excluded.bucket,
    payload = excluded.payload, priority = excluded.priority, max_attempts = excluded.max_attempts,
    timeout_ms = excluded.timeout_ms,
    enabled = CASE WHEN ?17 THEN excluded.enabled ELSE flotilla_schedules.enabled END,
    next_fire_at = CASE
        WHEN flotilla_schedules.spec <> excluded.spec OR flotilla_schedules.timezone <> excluded.timezone
            THEN excluded.next_fire_at
        WHEN ?17 AND excluded.enabled AND NOT flotilla_schedules.enabled
            THEN max(flotilla_schedules.next_fire_at, excluded.next_fire_at)
        ELSE flotilla_schedules.next_fire_at END,
    updated_at = excluded.updated_at`

// UpsertSchedule creates a schedule, or replaces the definition of one with
// the same name as mode says (store.ErrDuplicate for store.UpsertCreate). A
// replaced schedule keeps its creation and last firing times, its next fire
// time while the timing is the same, and whether it is paused unless mode
// is store.UpsertReplaceEnabled.
func (s *Store) UpsertSchedule(ctx context.Context, sc store.Schedule, mode store.UpsertMode) (store.Schedule, error) {
	if err := mode.Check(); err != nil {
		return store.Schedule{}, err
	}
	if err := s.checkSchedule(ctx, sc); err != nil {
		return store.Schedule{}, err
	}
	q := insertScheduleSQL
	if mode != store.UpsertCreate {
		q = upsertScheduleSQL
	}
	var out store.Schedule
	err := s.write(ctx, func(tx *wtx) error {
		args := []any{sc.Name, sc.Spec, sc.Timezone, sc.CatchUp, sc.Kind, sc.Key, sc.Bucket,
			string(jsonOrNull(sc.Payload)), sc.Priority, sc.MaxAttempts, sc.Timeout.Milliseconds(), sc.Enabled,
			dbTime(sc.NextFireAt).UnixMicro(), micros(dbTime(sc.LastFireAt)), tx.now.UnixMicro(), tx.now.UnixMicro()}
		if mode != store.UpsertCreate {
			args = append(args, mode == store.UpsertReplaceEnabled)
		}
		var err error
		out, err = scanSchedule(tx.queryRow(q+` RETURNING `+scheduleColumns, args...))
		if err != nil {
			err = translate(err)
			if errors.Is(err, store.ErrDuplicate) {
				return fmt.Errorf("schedule %q already exists: %w", sc.Name, store.ErrDuplicate)
			}
			return wrap(err, "write schedule %q", sc.Name)
		}
		tx.notify(store.TopicSchedules, strconv.Itoa(out.Bucket))
		return nil
	})
	if err != nil {
		return store.Schedule{}, requireSchema(err)
	}
	return out, nil
}

// GetSchedule reads one schedule.
func (s *Store) GetSchedule(ctx context.Context, name string) (store.Schedule, error) {
	if err := s.checkOpen(); err != nil {
		return store.Schedule{}, err
	}
	return loadSchedule(s.rdb, ctx, name)
}

// ListSchedules returns every schedule by name.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	return s.schedules(ctx, `SELECT `+scheduleColumns+` FROM flotilla_schedules ORDER BY name`)
}

func (s *Store) schedules(ctx context.Context, q string, args ...any) ([]store.Schedule, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, requireSchema(wrap(err, "list schedules"))
	}
	defer rows.Close()
	out := []store.Schedule{}
	for rows.Next() {
		sc, err := scanSchedule(rows)
		if err != nil {
			return nil, wrap(err, "list schedules")
		}
		out = append(out, sc)
	}
	return out, wrapIf(rows.Err(), "list schedules")
}

// DeleteSchedule removes a schedule. The tasks it fired stay, and with them
// the record of which ticks fired.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	err := s.write(ctx, func(tx *wtx) error {
		res, err := tx.exec(`DELETE FROM flotilla_schedules WHERE name = ?`, name)
		if err != nil {
			return wrap(err, "delete schedule %q", name)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return scheduleNotFound(name)
		}
		return nil
	})
	return requireSchema(err)
}

// SetScheduleEnabled pauses or resumes a schedule; resuming moves its next
// fire time up to resumeAt, so the pause's ticks are not fired as missed.
func (s *Store) SetScheduleEnabled(ctx context.Context, name string, enabled bool, resumeAt time.Time) (store.Schedule, error) {
	var out store.Schedule
	err := s.write(ctx, func(tx *wtx) error {
		sc, err := tx.schedule(name)
		if err != nil {
			return err
		}
		if enabled && !sc.Enabled && !resumeAt.IsZero() && dbTime(resumeAt).After(sc.NextFireAt) {
			sc.NextFireAt = dbTime(resumeAt)
		}
		sc.Enabled, sc.UpdatedAt = enabled, tx.now
		if _, err := tx.exec(`UPDATE flotilla_schedules SET enabled = ?, next_fire_at = ?, updated_at = ? WHERE name = ?`,
			enabled, sc.NextFireAt.UnixMicro(), tx.now.UnixMicro(), name); err != nil {
			return wrap(err, "update schedule %q", name)
		}
		if enabled {
			tx.notify(store.TopicSchedules, strconv.Itoa(sc.Bucket))
		}
		out = sc
		return nil
	})
	if err != nil {
		return store.Schedule{}, requireSchema(err)
	}
	return out, nil
}

// DueSchedules lists the enabled schedules of the given buckets whose next
// fire time has passed, earliest first.
func (s *Store) DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]store.Schedule, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	return s.schedules(ctx, `SELECT `+scheduleColumns+` FROM flotilla_schedules
		WHERE enabled AND bucket IN (SELECT value FROM json_each(?)) AND next_fire_at <= `+nowSQL+`
		ORDER BY next_fire_at, name LIMIT ?`, intsJSON(buckets.Slice()), limitOr(limit, defaultScanLimit))
}

// NextScheduleFire returns the earliest next fire time of the enabled
// schedules in buckets, and the clock.
func (s *Store) NextScheduleFire(ctx context.Context, buckets bucket.Set) (next, now time.Time, err error) {
	if err := s.checkOpen(); err != nil {
		return time.Time{}, time.Time{}, err
	}
	var first sql.NullInt64
	var us int64
	err = s.rdb.QueryRowContext(ctx, `SELECT min(next_fire_at), `+nowSQL+` FROM flotilla_schedules
		WHERE enabled AND bucket IN (SELECT value FROM json_each(?))`, intsJSON(buckets.Slice())).Scan(&first, &us)
	if err != nil {
		return time.Time{}, time.Time{}, requireSchema(wrap(err, "read the next schedule tick"))
	}
	if first.Valid {
		next = time.UnixMicro(first.Int64).UTC()
	}
	return next, time.UnixMicro(us).UTC(), nil
}

// FireSchedules applies a holder's decisions about its due schedules in one
// transaction. A tick whose task exists already, or whose unique key an
// unfinished task holds, is passed over: Fired is false and the schedule
// still advances.
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
	var fired []store.NewTask
	for _, r := range reqs {
		if r.Fire {
			fired = append(fired, firedTask(r))
		}
	}
	if len(fired) > 0 {
		n, err := s.fleetSize(ctx)
		if err != nil {
			return nil, err
		}
		if err := store.CheckNewTasks(fired, n); err != nil {
			return nil, fmt.Errorf("fire schedules: %w", err)
		}
	}
	var out []store.FireResult
	err := s.write(ctx, func(tx *wtx) error {
		out = make([]store.FireResult, len(reqs))
		for i, r := range reqs {
			res, err := fire(tx, owner, r)
			if err != nil {
				return err
			}
			out[i] = res
		}
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// firedTask is the task of r's tick.
func firedTask(r store.FireRequest) store.NewTask {
	nt := r.Task
	nt.Schedule, nt.ScheduledFor, nt.Pending = r.Name, r.ScheduledFor, false
	return nt
}

func fire(tx *wtx, owner string, r store.FireRequest) (store.FireResult, error) {
	sc, err := tx.schedule(r.Name)
	if errors.Is(err, store.ErrNotFound) {
		return store.FireResult{Err: err}, nil
	}
	if err != nil {
		return store.FireResult{}, err
	}
	live, err := leaseLiveFor(tx, sc.Bucket, owner, r.Epoch)
	if err != nil {
		return store.FireResult{}, err
	}
	switch from := dbTime(r.From); {
	case !live:
		return store.FireResult{Err: fmt.Errorf("schedule %s: %s does not hold bucket %d under epoch %d: %w",
			r.Name, owner, sc.Bucket, r.Epoch, store.ErrFenced)}, nil
	case !sc.Enabled:
		return store.FireResult{Err: fmt.Errorf("schedule %s is paused: %w", r.Name, store.ErrConflict)}, nil
	case !sc.NextFireAt.Equal(from):
		return store.FireResult{Err: fmt.Errorf("schedule %s: its next fire time is %s, no longer %s: %w", r.Name,
			sc.NextFireAt.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano), store.ErrConflict)}, nil
	}
	var res store.FireResult
	last := sc.LastFireAt
	if r.Fire {
		created, err := insertTasks(tx, []store.NewTask{firedTask(r)}, true)
		if err != nil {
			return store.FireResult{}, err
		}
		if created[0] != nil {
			res.Fired, res.Task = true, created[0]
		}
		last = dbTime(r.ScheduledFor)
	}
	if _, err := tx.exec(`UPDATE flotilla_schedules SET next_fire_at = ?, last_fire_at = ?, updated_at = ? WHERE name = ?`,
		dbTime(r.Next).UnixMicro(), micros(last), tx.now.UnixMicro(), r.Name); err != nil {
		return store.FireResult{}, wrap(err, "advance schedule %q", r.Name)
	}
	return res, nil
}
