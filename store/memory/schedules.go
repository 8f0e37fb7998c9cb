package memory

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// scheduleView is a copy of sc the caller may change.
func scheduleView(sc *store.Schedule) store.Schedule {
	out := *sc
	out.Payload = slices.Clone(sc.Payload)
	return out
}

func scheduleNotFound(name string) error {
	return fmt.Errorf("schedule %q: %w", name, store.ErrNotFound)
}

// checkSchedule refuses a definition no store could keep. The spec itself
// is package schedule's to parse.
func (db *database) checkSchedule(sc store.Schedule) error {
	switch {
	case sc.Name == "":
		return fmt.Errorf("%w: a schedule needs a name", store.ErrInvalid)
	case sc.Spec == "":
		return fmt.Errorf("%w: schedule %q has no spec", store.ErrInvalid, sc.Name)
	case sc.Kind == "":
		return fmt.Errorf("%w: schedule %q has no task kind", store.ErrInvalid, sc.Name)
	case sc.CatchUp != "" && sc.CatchUp != store.CatchUpSkip && sc.CatchUp != store.CatchUpLatest:
		return fmt.Errorf("%w: schedule %q: unknown catch-up policy %q: valid policies are %s and %s",
			store.ErrInvalid, sc.Name, sc.CatchUp, store.CatchUpSkip, store.CatchUpLatest)
	case sc.MaxAttempts < 0:
		return fmt.Errorf("%w: schedule %q: max attempts %d is negative", store.ErrInvalid, sc.Name, sc.MaxAttempts)
	case store.CheckTimeout(sc.Timeout) != nil:
		return fmt.Errorf("%w: schedule %q: %w", store.ErrInvalid, sc.Name, store.CheckTimeout(sc.Timeout))
	}
	if err := db.checkBucket(sc.Bucket); err != nil {
		return fmt.Errorf("schedule %q: %w", sc.Name, err)
	}
	if err := checkJSON("payload", sc.Payload); err != nil {
		return fmt.Errorf("schedule %q: %w", sc.Name, err)
	}
	return nil
}

// UpsertSchedule creates a schedule, or replaces the definition of one with
// the same name as mode says. A replaced schedule keeps its creation and
// last firing times, which are history rather than definition, and whether
// it is paused unless mode is store.UpsertReplaceEnabled.
func (s *Store) UpsertSchedule(ctx context.Context, sc store.Schedule, mode store.UpsertMode) (store.Schedule, error) {
	if err := mode.Check(); err != nil {
		return store.Schedule{}, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	defer db.mu.Unlock()
	if err := db.checkSchedule(sc); err != nil {
		return store.Schedule{}, err
	}

	now := db.now()
	stored := sc
	stored.Payload = jsonOrNull(sc.Payload)
	stored.NextFireAt = dbTime(sc.NextFireAt)
	stored.LastFireAt = dbTime(sc.LastFireAt)
	stored.CreatedAt = now
	stored.UpdatedAt = now
	if prev := db.schedules[sc.Name]; prev != nil {
		if mode == store.UpsertCreate {
			return store.Schedule{}, fmt.Errorf("schedule %q already exists: %w", sc.Name, store.ErrDuplicate)
		}
		stored.CreatedAt = prev.CreatedAt
		stored.LastFireAt = prev.LastFireAt
		sameTiming := prev.Spec == sc.Spec && prev.Timezone == sc.Timezone
		if sameTiming {
			// Declared again with the same timing (every node start does
			// this): the tick about to fire must not move.
			stored.NextFireAt = prev.NextFireAt
		}
		switch {
		case mode == store.UpsertReplace:
			// An operator's pause is not the definition's to undo.
			stored.Enabled = prev.Enabled
		case sameTiming && sc.Enabled && !prev.Enabled && stored.NextFireAt.Before(dbTime(sc.NextFireAt)):
			// Resumed: the ticks of the pause are not fired late.
			stored.NextFireAt = dbTime(sc.NextFireAt)
		}
	}
	db.schedules[sc.Name] = &stored
	db.publish(store.TopicSchedules, strconv.Itoa(stored.Bucket))
	return scheduleView(&stored), nil
}

// GetSchedule reads one schedule.
func (s *Store) GetSchedule(ctx context.Context, name string) (store.Schedule, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	defer db.mu.Unlock()
	sc := db.schedules[name]
	if sc == nil {
		return store.Schedule{}, scheduleNotFound(name)
	}
	return scheduleView(sc), nil
}

// ListSchedules returns every schedule by name.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	out := make([]store.Schedule, 0, len(db.schedules))
	for _, sc := range db.schedules {
		out = append(out, scheduleView(sc))
	}
	slices.SortFunc(out, func(a, b store.Schedule) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteSchedule removes a schedule. The tasks it fired stay, and so does
// the record of which ticks fired: a schedule created again under the same
// name does not fire those ticks a second time.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	if db.schedules[name] == nil {
		return scheduleNotFound(name)
	}
	delete(db.schedules, name)
	return nil
}

// SetScheduleEnabled pauses or resumes a schedule; resuming moves its next
// fire time up to resumeAt, so the pause's ticks are not fired as missed.
func (s *Store) SetScheduleEnabled(ctx context.Context, name string, enabled bool, resumeAt time.Time) (store.Schedule, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	defer db.mu.Unlock()
	sc := db.schedules[name]
	if sc == nil {
		return store.Schedule{}, scheduleNotFound(name)
	}
	if enabled && !sc.Enabled && !resumeAt.IsZero() && dbTime(resumeAt).After(sc.NextFireAt) {
		sc.NextFireAt = dbTime(resumeAt)
	}
	sc.Enabled = enabled
	sc.UpdatedAt = db.now()
	if enabled {
		db.publish(store.TopicSchedules, strconv.Itoa(sc.Bucket))
	}
	return scheduleView(sc), nil
}

// NextScheduleFire returns the earliest next fire time of the enabled
// schedules in buckets, and now.
func (s *Store) NextScheduleFire(ctx context.Context, buckets bucket.Set) (next, now time.Time, err error) {
	db, err := s.begin(ctx)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	defer db.mu.Unlock()
	for _, sc := range db.schedules {
		if sc.Enabled && buckets.Contains(sc.Bucket) && (next.IsZero() || sc.NextFireAt.Before(next)) {
			next = sc.NextFireAt
		}
	}
	return next, db.now(), nil
}

// DueSchedules lists the enabled schedules of the given buckets whose next
// fire time has passed, earliest first.
func (s *Store) DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]store.Schedule, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	var due []*store.Schedule
	for _, sc := range db.schedules {
		if sc.Enabled && buckets.Contains(sc.Bucket) && !sc.NextFireAt.After(now) {
			due = append(due, sc)
		}
	}
	slices.SortFunc(due, func(a, b *store.Schedule) int {
		if c := a.NextFireAt.Compare(b.NextFireAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	due = due[:min(len(due), limitOr(limit, defaultScanLimit))]
	out := make([]store.Schedule, len(due))
	for i, sc := range due {
		out[i] = scheduleView(sc)
	}
	return out, nil
}

// FireSchedules applies a holder's decisions about its due schedules, all
// in one step.
func (s *Store) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	if owner == "" {
		return nil, fmt.Errorf("fire schedules: no owner: %w", store.ErrInvalid)
	}
	if err := store.CheckFireRequests(reqs); err != nil {
		return nil, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	// Validate every task first, so a bad one writes nothing.
	for _, r := range reqs {
		if !r.Fire {
			continue
		}
		if err := store.CheckNewTasks([]store.NewTask{firedTask(r)}, db.fleet.NumBuckets); err != nil {
			return nil, fmt.Errorf("fire schedules: schedule %q: %w", r.Name, err)
		}
	}
	now := db.now()
	out := make([]store.FireResult, len(reqs))
	for i, r := range reqs {
		out[i] = db.fire(owner, r, now)
	}
	return out, nil
}

// firedTask is the task of r's tick.
func firedTask(r store.FireRequest) store.NewTask {
	nt := r.Task
	nt.Schedule, nt.ScheduledFor, nt.Pending = r.Name, dbTime(r.ScheduledFor), false
	return nt
}

func (db *database) fire(owner string, r store.FireRequest, now time.Time) store.FireResult {
	sc := db.schedules[r.Name]
	if sc == nil {
		return store.FireResult{Err: scheduleNotFound(r.Name)}
	}
	if !db.leases[sc.Bucket].liveFor(owner, r.Epoch, now) {
		return store.FireResult{Err: fmt.Errorf("schedule %q: %s does not hold bucket %d under epoch %d: %w",
			r.Name, owner, sc.Bucket, r.Epoch, store.ErrFenced)}
	}
	if !sc.Enabled {
		return store.FireResult{Err: fmt.Errorf("schedule %q is paused: %w", r.Name, store.ErrConflict)}
	}
	if from := dbTime(r.From); !sc.NextFireAt.Equal(from) {
		return store.FireResult{Err: fmt.Errorf("schedule %q: its next fire time is %s, no longer %s: %w", r.Name,
			sc.NextFireAt.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano), store.ErrConflict)}
	}
	var res store.FireResult
	if r.Fire {
		nt := firedTask(r)
		_, done := db.fired[fireKey{sc.Name, nt.ScheduledFor}]
		_, busy := db.uniqueKeys[nt.UniqueKey]
		// A tick fired before (by an earlier epoch, or a retried call), or
		// whose unique key the previous run still holds, is passed over.
		if !done && !(nt.UniqueKey != "" && busy) {
			rec := db.insertTask(nt, now)
			if rec.Status == task.Queued {
				db.announceTasks(rec.Bucket)
			}
			res.Fired, res.Task = true, rec.snapshot()
		}
		sc.LastFireAt = nt.ScheduledFor
	}
	sc.NextFireAt = dbTime(r.Next)
	sc.UpdatedAt = now
	return res
}
