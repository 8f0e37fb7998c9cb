package memory

import (
	"context"
	"fmt"
	"slices"
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
	case sc.Timeout < 0:
		return fmt.Errorf("%w: schedule %q: timeout %v is negative", store.ErrInvalid, sc.Name, sc.Timeout)
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
// the same name when replace is set. A replaced schedule keeps its creation
// and last firing times, which are history rather than definition.
func (s *Store) UpsertSchedule(ctx context.Context, sc store.Schedule, replace bool) (store.Schedule, error) {
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
		if !replace {
			return store.Schedule{}, fmt.Errorf("schedule %q already exists: %w", sc.Name, store.ErrDuplicate)
		}
		stored.CreatedAt = prev.CreatedAt
		stored.LastFireAt = prev.LastFireAt
	}
	db.schedules[sc.Name] = &stored
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

// SetScheduleEnabled pauses or resumes a schedule.
func (s *Store) SetScheduleEnabled(ctx context.Context, name string, enabled bool) (store.Schedule, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	defer db.mu.Unlock()
	sc := db.schedules[name]
	if sc == nil {
		return store.Schedule{}, scheduleNotFound(name)
	}
	if sc.Enabled != enabled {
		sc.Enabled = enabled
		sc.UpdatedAt = db.now()
	}
	return scheduleView(sc), nil
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

// FireSchedule creates the task of one tick and advances the schedule, in
// one step, while req.Owner holds the schedule's bucket under req.Epoch.
func (s *Store) FireSchedule(ctx context.Context, req store.FireRequest) (*task.Task, bool, error) {
	scheduledFor, next := dbTime(req.ScheduledFor), dbTime(req.Next)
	if !next.After(scheduledFor) {
		// A schedule that does not move forward would fire the same tick
		// for ever.
		return nil, false, fmt.Errorf("%w: schedule %q: next fire time %s is not after the tick %s",
			store.ErrInvalid, req.Name, next.Format(time.RFC3339Nano), scheduledFor.Format(time.RFC3339Nano))
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer db.mu.Unlock()

	sc := db.schedules[req.Name]
	if sc == nil {
		return nil, false, scheduleNotFound(req.Name)
	}
	now := db.now()
	if !db.leases[sc.Bucket].liveFor(req.Owner, req.Epoch, now) {
		return nil, false, fmt.Errorf("schedule %q: %s does not hold bucket %d under epoch %d: %w",
			req.Name, req.Owner, sc.Bucket, req.Epoch, store.ErrFenced)
	}
	if !sc.NextFireAt.Equal(scheduledFor) {
		return nil, false, fmt.Errorf("schedule %q: next fire time is %s, not %s: %w", req.Name,
			sc.NextFireAt.Format(time.RFC3339Nano), scheduledFor.Format(time.RFC3339Nano), store.ErrConflict)
	}
	if !sc.Enabled {
		// Paused between the read that found it due and this write: the
		// row changed since it was read.
		return nil, false, fmt.Errorf("schedule %q was paused: %w", req.Name, store.ErrConflict)
	}

	nt := req.Task
	nt.Schedule, nt.ScheduledFor = sc.Name, scheduledFor
	var (
		rec   *taskRecord
		fired bool
	)
	if id, done := db.fired[fireKey{sc.Name, scheduledFor}]; done {
		// Another holder (an earlier epoch, or a retry of this call) fired
		// the tick already.
		rec = db.task(id)
	} else if id, busy := db.uniqueKeys[nt.UniqueKey]; nt.UniqueKey != "" && busy {
		// The previous run still holds the unique key: this tick is skipped,
		// as a unique key means "never two at once".
		rec = db.task(id)
	} else {
		if err := db.checkNewTask(nt); err != nil {
			return nil, false, fmt.Errorf("schedule %q: %w", sc.Name, err)
		}
		rec, fired = db.insertTask(nt, now), true
		if rec.Status == task.Queued {
			db.announceTasks(rec.Bucket)
		}
	}
	sc.NextFireAt = next
	sc.LastFireAt = scheduledFor
	sc.UpdatedAt = now
	return rec.snapshot(), fired, nil
}
