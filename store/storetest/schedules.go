package storetest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func testSchedules(t *testing.T, h Harness) {
	newSchedule := func(b *testBundle, name string, bucketNo int, next time.Time) store.Schedule {
		b.t.Helper()
		s, err := b.s.UpsertSchedule(b.ctx, store.Schedule{Name: name, Spec: "@every 1m", CatchUp: store.CatchUpSkip,
			Kind: "report", Key: name, Bucket: bucketNo, Payload: json.RawMessage(`{"x":1}`), Priority: 2,
			MaxAttempts: 4, Enabled: true, NextFireAt: next}, false)
		if err != nil {
			b.t.Fatalf("UpsertSchedule(%s): %v", name, err)
		}
		return s
	}

	t.Run("Upsert", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		created := newSchedule(b, "nightly", 1, now.Add(time.Hour))
		if created.CreatedAt.IsZero() || !created.Enabled || created.Spec != "@every 1m" {
			t.Errorf("created %+v", created)
		}
		_, err := b.s.UpsertSchedule(b.ctx, store.Schedule{Name: "nightly", Spec: "@every 2m", Kind: "report", Bucket: 1,
			Enabled: true, NextFireAt: now}, false)
		if !errors.Is(err, store.ErrDuplicate) {
			t.Fatalf("an existing name without replace: %v, want store.ErrDuplicate", err)
		}
		replaced, err := b.s.UpsertSchedule(b.ctx, store.Schedule{Name: "nightly", Spec: "@every 2m", Kind: "report", Bucket: 1,
			Enabled: true, NextFireAt: now}, true)
		if err != nil || replaced.Spec != "@every 2m" {
			t.Fatalf("replace: %+v %v", replaced, err)
		}
		list, _ := b.s.ListSchedules(b.ctx)
		if len(list) != 1 {
			t.Errorf("%d schedules after replace", len(list))
		}
		paused, err := b.s.SetScheduleEnabled(b.ctx, "nightly", false)
		if err != nil || paused.Enabled {
			t.Errorf("pause: %+v %v", paused, err)
		}
		if err := b.s.DeleteSchedule(b.ctx, "nightly"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.s.GetSchedule(b.ctx, "nightly"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleted schedule: %v", err)
		}
		if err := b.s.DeleteSchedule(b.ctx, "nightly"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("delete twice: %v", err)
		}
		if _, err := b.s.SetScheduleEnabled(b.ctx, "nope", true); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("enable a missing schedule: %v", err)
		}
	})

	t.Run("DueInBuckets", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		newSchedule(b, "due-1", 1, now.Add(-time.Minute))
		newSchedule(b, "due-2", 2, now.Add(-2*time.Minute))
		newSchedule(b, "later", 1, now.Add(time.Hour))
		newSchedule(b, "off", 1, now.Add(-time.Minute))
		if _, err := b.s.SetScheduleEnabled(b.ctx, "off", false); err != nil {
			t.Fatal(err)
		}
		due, err := b.s.DueSchedules(b.ctx, bucket.Of(1, 2), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) != 2 || due[0].Name != "due-2" || due[1].Name != "due-1" {
			t.Errorf("due: %+v, want due-2 then due-1", due)
		}
		if due, _ := b.s.DueSchedules(b.ctx, bucket.Of(1), 10); len(due) != 1 || due[0].Name != "due-1" {
			t.Errorf("due in bucket 1 only: %+v", due)
		}
	})

	t.Run("FireOncePerTick", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "every-minute", 1, tick)
		held := b.hold("a", 1)
		req := store.FireRequest{Owner: "a", Node: "node-a", Name: "every-minute", Epoch: held[0].Epoch,
			ScheduledFor: tick, Next: tick.Add(time.Minute),
			Task: store.NewTask{Kind: "report", Key: "every-minute", Bucket: 1, Priority: 2, MaxAttempts: 4}}
		fired, ok, err := b.s.FireSchedule(b.ctx, req)
		if err != nil || !ok {
			t.Fatalf("first firing: %v %v", ok, err)
		}
		if fired.Schedule != "every-minute" || !fired.ScheduledFor.Equal(tick) || fired.Status != task.Queued || fired.Priority != 2 {
			t.Errorf("fired task %+v", fired)
		}
		s, _ := b.s.GetSchedule(b.ctx, "every-minute")
		if !s.NextFireAt.Equal(tick.Add(time.Minute)) || !s.LastFireAt.Equal(tick) {
			t.Errorf("after firing: next %v last %v", s.NextFireAt, s.LastFireAt)
		}
		// The same tick again: the schedule has moved on, so it is a conflict
		// and creates nothing.
		if _, _, err := b.s.FireSchedule(b.ctx, req); !errors.Is(err, store.ErrConflict) {
			t.Errorf("firing a tick the schedule has passed: %v, want store.ErrConflict", err)
		}
		list, _ := b.s.ListTasks(b.ctx, store.TaskFilter{Schedule: "every-minute"})
		if len(list) != 1 {
			t.Fatalf("%d tasks for one tick", len(list))
		}
	})

	t.Run("ATickAlreadyFiredAdvancesWithoutASecondTask", func(t *testing.T) {
		// Two holders that both believed they held the bucket: the unique
		// (schedule, scheduled_for) makes the second firing a no-op.
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "s", 1, tick)
		b.create(store.NewTask{Kind: "report", Key: "s", Bucket: 1, Schedule: "s", ScheduledFor: tick})
		held := b.hold("a", 1)
		_, ok, err := b.s.FireSchedule(b.ctx, store.FireRequest{Owner: "a", Name: "s", Epoch: held[0].Epoch,
			ScheduledFor: tick, Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Key: "s", Bucket: 1}})
		if err != nil || ok {
			t.Fatalf("firing an already-fired tick: fired=%v err=%v, want not fired and no error", ok, err)
		}
		if list, _ := b.s.ListTasks(b.ctx, store.TaskFilter{Schedule: "s"}); len(list) != 1 {
			t.Errorf("%d tasks for one tick", len(list))
		}
		if s, _ := b.s.GetSchedule(b.ctx, "s"); !s.NextFireAt.Equal(tick.Add(time.Minute)) {
			t.Errorf("schedule did not advance: next %v", s.NextFireAt)
		}
	})

	t.Run("OnlyTheHolderFires", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "s", 1, tick)
		held := b.hold("a", 1)
		fire := func(owner string, epoch int64) error {
			_, _, err := b.s.FireSchedule(b.ctx, store.FireRequest{Owner: owner, Name: "s", Epoch: epoch,
				ScheduledFor: tick, Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Key: "s", Bucket: 1}})
			return err
		}
		if err := fire("b", held[0].Epoch); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing by a non-holder: %v, want store.ErrFenced", err)
		}
		if err := fire("a", held[0].Epoch+1); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing under a wrong epoch: %v, want store.ErrFenced", err)
		}
		h.ExpireBucketLease(t, b.s, 1)
		if err := fire("a", held[0].Epoch); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing past the lease: %v, want store.ErrFenced", err)
		}
		if list, _ := b.s.ListTasks(b.ctx, store.TaskFilter{Schedule: "s"}); len(list) != 0 {
			t.Errorf("refused firings created %d tasks", len(list))
		}
		if s, _ := b.s.GetSchedule(b.ctx, "s"); !s.NextFireAt.Equal(tick) {
			t.Errorf("refused firings moved the schedule to %v", s.NextFireAt)
		}
	})
}
