package flotilla

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// AddSchedule creates a schedule, due first at its first tick from now, and
// paused if d.Paused is set. A schedule of the same name is, as mode says:
//
//   - store.UpsertCreate: refused, matching store.ErrDuplicate;
//   - store.UpsertReplace: replaced, but left paused or running as it is,
//     so that an operator's pause is not undone by a new definition;
//   - store.UpsertReplaceEnabled: replaced, and paused if d.Paused is set,
//     resumed otherwise, from its first tick after now.
//
// A replaced schedule keeps its next tick while its timing is unchanged. A
// definition that could never fire is refused before anything is written
// (matching schedule.ErrInvalidDefinition or schedule.ErrInvalidSpec).
//
// A schedule is a lasting definition, added before or after the nodes that
// fire it start, so a bucket nobody holds is not a refusal here; the report
// says so in Waiting.
func (c *Client) AddSchedule(ctx context.Context, d schedule.Definition, mode store.UpsertMode) (ScheduleReport, error) {
	if err := mode.Check(); err != nil {
		return ScheduleReport{}, err
	}
	now, err := c.store.Now(ctx)
	if err != nil {
		return ScheduleReport{}, err
	}
	sc, err := d.Resolve(c.policy, now)
	if err != nil {
		return ScheduleReport{}, err
	}
	if err := store.CheckScheduleInput(sc); err != nil {
		return ScheduleReport{}, err
	}
	saved, err := c.store.UpsertSchedule(ctx, sc, mode)
	if err != nil {
		return ScheduleReport{}, err
	}
	view, err := c.view(ctx)
	if err != nil {
		return ScheduleReport{}, err
	}
	return newScheduleReport(saved, view), nil
}

func newScheduleReport(sc store.Schedule, v fleetView) ScheduleReport {
	r := ScheduleReport{Schedule: sc, Waiting: waitingReason(&task.Task{Bucket: sc.Bucket, Kind: sc.Kind}, v)}
	if holder, ok := v.holders[sc.Bucket]; ok {
		r.Holder = holder.ID
	}
	return r
}

// ScheduleReport is a schedule with the node that fires it.
type ScheduleReport struct {
	store.Schedule
	// Holder is the node holding the schedule's bucket, which fires it; ""
	// when nobody does, and the schedule waits.
	Holder string
	// Waiting says why the schedule's ticks do not run, when the fleet's
	// state explains it: nobody holds its bucket (nothing fires), or the
	// holder does not run its kind (its tasks wait). Empty otherwise.
	Waiting string
}

// Schedules lists every schedule by name, with the holder of its bucket.
func (c *Client) Schedules(ctx context.Context) ([]ScheduleReport, error) {
	list, err := c.store.ListSchedules(ctx)
	if err != nil {
		return nil, err
	}
	view, err := c.freshView(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ScheduleReport, len(list))
	for i, sc := range list {
		out[i] = newScheduleReport(sc, view)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveSchedule deletes a schedule; the tasks it fired stay. A missing one
// matches store.ErrNotFound.
func (c *Client) RemoveSchedule(ctx context.Context, name string) error {
	return c.store.DeleteSchedule(ctx, name)
}

// PauseSchedule stops a schedule from firing until ResumeSchedule.
func (c *Client) PauseSchedule(ctx context.Context, name string) (store.Schedule, error) {
	return c.store.SetScheduleEnabled(ctx, name, false, time.Time{})
}

// ResumeSchedule lets a paused schedule fire again from its first tick after
// now: the ticks of the pause are not fired late.
func (c *Client) ResumeSchedule(ctx context.Context, name string) (store.Schedule, error) {
	sc, err := c.store.GetSchedule(ctx, name)
	if err != nil {
		return store.Schedule{}, err
	}
	spec, err := schedule.Parse(sc.Spec, sc.Timezone)
	if err != nil {
		return store.Schedule{}, fmt.Errorf("schedule %q: its stored spec no longer parses; replace it: %w", name, err)
	}
	now, err := c.store.Now(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	return c.store.SetScheduleEnabled(ctx, name, true, spec.First(now))
}
