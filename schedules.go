package flotilla

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

// AddSchedule creates a schedule, due first at its first tick from now. A
// schedule of the same name is refused (matching store.ErrDuplicate) unless
// replace is set; a replaced schedule keeps its next tick while its timing
// is unchanged. A definition that could never fire is refused before
// anything is written (matching schedule.ErrInvalidDefinition or
// schedule.ErrInvalidSpec).
func (c *Client) AddSchedule(ctx context.Context, d schedule.Definition, replace bool) (store.Schedule, error) {
	now, err := c.store.Now(ctx)
	if err != nil {
		return store.Schedule{}, err
	}
	sc, err := d.Resolve(c.policy, now)
	if err != nil {
		return store.Schedule{}, err
	}
	return c.store.UpsertSchedule(ctx, sc, replace)
}

// ScheduleReport is a schedule with the node that fires it.
type ScheduleReport struct {
	store.Schedule
	// Holder is the node holding the schedule's bucket, which fires it; ""
	// when nobody does, and the schedule waits.
	Holder string
}

// Schedules lists every schedule by name, with the holder of its bucket.
func (c *Client) Schedules(ctx context.Context) ([]ScheduleReport, error) {
	list, err := c.store.ListSchedules(ctx)
	if err != nil {
		return nil, err
	}
	leases, err := c.store.ListBuckets(ctx)
	if err != nil {
		return nil, err
	}
	holders := make(map[int]string, len(leases))
	for _, l := range leases {
		if l.Holder != "" {
			holders[l.Bucket] = l.Node
		}
	}
	out := make([]ScheduleReport, len(list))
	for i, sc := range list {
		out[i] = ScheduleReport{Schedule: sc, Holder: holders[sc.Bucket]}
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
