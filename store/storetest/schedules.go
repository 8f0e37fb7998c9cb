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
			MaxAttempts: 4, Enabled: true, NextFireAt: next}, store.UpsertCreate)
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
			Enabled: true, NextFireAt: now}, store.UpsertCreate)
		if !errors.Is(err, store.ErrDuplicate) {
			t.Fatalf("an existing name without replace: %v, want store.ErrDuplicate", err)
		}
		replaced, err := b.s.UpsertSchedule(b.ctx, store.Schedule{Name: "nightly", Spec: "@every 2m", Kind: "report", Bucket: 1,
			Enabled: true, NextFireAt: now}, store.UpsertReplace)
		if err != nil || replaced.Spec != "@every 2m" {
			t.Fatalf("replace: %+v %v", replaced, err)
		}
		list, _ := b.s.ListSchedules(b.ctx)
		if len(list) != 1 {
			t.Errorf("%d schedules after replace", len(list))
		}
		paused, err := b.s.SetScheduleEnabled(b.ctx, "nightly", false, time.Time{})
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
		if _, err := b.s.SetScheduleEnabled(b.ctx, "nope", true, time.Time{}); !errors.Is(err, store.ErrNotFound) {
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
		if _, err := b.s.SetScheduleEnabled(b.ctx, "off", false, time.Time{}); err != nil {
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

	t.Run("NextFireOfTheBuckets", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		if next, at, err := b.s.NextScheduleFire(b.ctx, bucket.Of(1, 2)); err != nil || !next.IsZero() || at.IsZero() {
			t.Fatalf("no schedule: next %v, now %v, %v; want no next, and the clock", next, at, err)
		}
		newSchedule(b, "soon-off", 1, now.Add(time.Minute))
		if _, err := b.s.SetScheduleEnabled(b.ctx, "soon-off", false, time.Time{}); err != nil {
			t.Fatal(err)
		}
		newSchedule(b, "elsewhere", 3, now.Add(2*time.Minute))
		later := newSchedule(b, "later", 2, now.Add(time.Hour))
		first := newSchedule(b, "first", 1, now.Add(10*time.Minute))
		next, at, err := b.s.NextScheduleFire(b.ctx, bucket.Of(1, 2))
		if err != nil {
			t.Fatal(err)
		}
		if !next.Equal(first.NextFireAt) {
			t.Errorf("next %v, want first's %v (paused and other buckets' left out)", next, first.NextFireAt)
		}
		if at.Before(now) {
			t.Errorf("now %v, before the clock read earlier, %v", at, now)
		}
		if next, _, _ := b.s.NextScheduleFire(b.ctx, bucket.Of(2)); !next.Equal(later.NextFireAt) {
			t.Errorf("next in bucket 2 %v, want %v", next, later.NextFireAt)
		}
	})

	t.Run("ReplaceKeepsTheNextTickWhileTheTimingIsUnchanged", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(time.Minute).Truncate(time.Second)
		newSchedule(b, "s", 1, tick)
		again := store.Schedule{Name: "s", Spec: "@every 1m", Kind: "other", Bucket: 1, Enabled: true,
			NextFireAt: tick.Add(time.Minute)}
		got, err := b.s.UpsertSchedule(b.ctx, again, store.UpsertReplace)
		if err != nil || !got.NextFireAt.Equal(tick) || got.Kind != "other" {
			t.Errorf("declared again with the same spec: next %v kind %q err %v, want next %v kind other",
				got.NextFireAt, got.Kind, err, tick)
		}
		again.Spec = "@every 2m"
		got, err = b.s.UpsertSchedule(b.ctx, again, store.UpsertReplace)
		if err != nil || !got.NextFireAt.Equal(tick.Add(time.Minute)) {
			t.Errorf("declared with a new spec: next %v err %v, want %v", got.NextFireAt, err, tick.Add(time.Minute))
		}
	})

	t.Run("ReplaceKeepsAPauseUnlessToldOtherwise", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		past := now.Add(-time.Hour).Truncate(time.Second) // due: the tick from before the pause
		newSchedule(b, "s", 1, past)
		if _, err := b.s.SetScheduleEnabled(b.ctx, "s", false, time.Time{}); err != nil {
			t.Fatal(err)
		}
		first := now.Add(time.Minute).Truncate(time.Second) // the first tick after now
		def := store.Schedule{Name: "s", Spec: "@every 1m", Kind: "report2", Key: "s", Bucket: 1, Enabled: true,
			NextFireAt: first}

		// Replaced, or declared again, with the definition's Enabled.
		got, err := b.s.UpsertSchedule(b.ctx, def, store.UpsertReplace)
		if err != nil || got.Enabled || got.Kind != "report2" || !got.NextFireAt.Equal(past) {
			t.Fatalf("replaced: enabled %v kind %q next %v (%v), want still paused, kind report2, next %v",
				got.Enabled, got.Kind, got.NextFireAt, err, past)
		}
		if due, _ := b.s.DueSchedules(b.ctx, bucket.Of(1), 10); len(due) != 0 {
			t.Errorf("a paused schedule is due after a replace: %+v", due)
		}
		res, err := b.s.FireSchedules(b.ctx, "a", []store.FireRequest{{Name: "s", Epoch: b.hold("a", 1)[0].Epoch, Fire: true,
			ScheduledFor: past, Next: first, Task: store.NewTask{Kind: "report2", Bucket: 1}}})
		if err != nil || !errors.Is(res[0].Err, store.ErrConflict) || res[0].Fired {
			t.Errorf("firing the tick from before the pause: %+v %v, want store.ErrConflict and no task", res, err)
		}

		// Told to write Enabled: resumed from the first tick after now.
		got, err = b.s.UpsertSchedule(b.ctx, def, store.UpsertReplaceEnabled)
		if err != nil || !got.Enabled || !got.NextFireAt.Equal(first) {
			t.Fatalf("replaced and resumed: enabled %v next %v (%v), want enabled, next %v", got.Enabled,
				got.NextFireAt, err, first)
		}
		// A replace of a running schedule leaves it running.
		def.Enabled = false
		if got, err = b.s.UpsertSchedule(b.ctx, def, store.UpsertReplace); err != nil || !got.Enabled {
			t.Errorf("a running schedule replaced by a paused definition: enabled %v (%v), want still running",
				got.Enabled, err)
		}
		// And told to, pauses it, its next tick kept.
		if got, err = b.s.UpsertSchedule(b.ctx, def, store.UpsertReplaceEnabled); err != nil || got.Enabled ||
			!got.NextFireAt.Equal(first) {
			t.Errorf("replaced and paused: enabled %v next %v (%v), want paused, next %v", got.Enabled,
				got.NextFireAt, err, first)
		}
		// A new schedule is created with the definition's Enabled.
		def.Name = "new"
		if got, err = b.s.UpsertSchedule(b.ctx, def, store.UpsertReplace); err != nil || got.Enabled {
			t.Errorf("created paused through a replace: enabled %v (%v), want paused", got.Enabled, err)
		}
		if _, err := b.s.UpsertSchedule(b.ctx, def, store.UpsertMode(7)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("an unknown mode: %v, want store.ErrInvalid", err)
		}
	})

	// A node declares its schedules at every start while an operator may
	// pause one: whatever the order, a pause that committed is never undone
	// by a declaration, which reads nothing before it writes.
	t.Run("ADeclarationNeverUndoesAConcurrentPause", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		newSchedule(b, "s", 1, now.Add(time.Minute).Truncate(time.Second))
		def := store.Schedule{Name: "s", Spec: "@every 1m", Kind: "report", Key: "s", Bucket: 1, Enabled: true,
			NextFireAt: now.Add(time.Minute).Truncate(time.Second)}
		for i := range 20 {
			if _, err := b.s.SetScheduleEnabled(b.ctx, "s", true, time.Time{}); err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, 2)
			go func() {
				_, err := b.s.SetScheduleEnabled(b.ctx, "s", false, time.Time{})
				errs <- err
			}()
			go func() {
				_, err := b.s.UpsertSchedule(b.ctx, def, store.UpsertReplace)
				errs <- err
			}()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got, err := b.s.GetSchedule(b.ctx, "s"); err != nil || got.Enabled {
				t.Fatalf("round %d: a pause and a declaration at once left the schedule enabled %v (%v), want paused",
					i, got.Enabled, err)
			}
		}
	})

	t.Run("ResumeSkipsTheTicksOfThePause", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		past := now.Add(-time.Hour).Truncate(time.Second)
		newSchedule(b, "s", 1, past)
		if _, err := b.s.SetScheduleEnabled(b.ctx, "s", false, time.Time{}); err != nil {
			t.Fatal(err)
		}
		resumeAt := now.Add(time.Minute).Truncate(time.Second)
		got, err := b.s.SetScheduleEnabled(b.ctx, "s", true, resumeAt)
		if err != nil || !got.Enabled || !got.NextFireAt.Equal(resumeAt) {
			t.Errorf("resumed: %+v %v, want enabled with next %v", got, err, resumeAt)
		}
		// Resuming what is not paused moves nothing.
		got, _ = b.s.SetScheduleEnabled(b.ctx, "s", true, resumeAt.Add(time.Hour))
		if !got.NextFireAt.Equal(resumeAt) {
			t.Errorf("resuming a running schedule moved it to %v", got.NextFireAt)
		}
	})

	// fire applies one request and returns its result.
	fire := func(b *testBundle, owner string, req store.FireRequest) store.FireResult {
		b.t.Helper()
		out, err := b.s.FireSchedules(b.ctx, owner, []store.FireRequest{req})
		if err != nil {
			b.t.Fatalf("FireSchedules(%s): %v", req.Name, err)
		}
		if len(out) != 1 {
			b.t.Fatalf("FireSchedules(%s): %d results for one request", req.Name, len(out))
		}
		return out[0]
	}
	tasksOf := func(b *testBundle, name string) []*task.Task {
		b.t.Helper()
		list, err := b.s.ListTasks(b.ctx, store.TaskFilter{Schedule: name})
		if err != nil {
			b.t.Fatal(err)
		}
		return list
	}

	t.Run("FireOncePerTick", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "every-minute", 1, tick)
		held := b.hold("a", 1)
		req := store.FireRequest{Name: "every-minute", Epoch: held[0].Epoch, Fire: true,
			ScheduledFor: tick, Next: tick.Add(time.Minute),
			Task: store.NewTask{Kind: "report", Key: "every-minute", Bucket: 1, Priority: 2, MaxAttempts: 4}}
		res := fire(b, "a", req)
		if res.Err != nil || !res.Fired {
			t.Fatalf("first firing: %+v", res)
		}
		if f := res.Task; f.Schedule != "every-minute" || !f.ScheduledFor.Equal(tick) || f.Status != task.Queued || f.Priority != 2 {
			t.Errorf("fired task %+v", f)
		}
		s, _ := b.s.GetSchedule(b.ctx, "every-minute")
		if !s.NextFireAt.Equal(tick.Add(time.Minute)) || !s.LastFireAt.Equal(tick) {
			t.Errorf("after firing: next %v last %v", s.NextFireAt, s.LastFireAt)
		}
		// The same tick again: the schedule has moved on, so it is a conflict
		// and creates nothing.
		if res := fire(b, "a", req); !errors.Is(res.Err, store.ErrConflict) || res.Fired {
			t.Errorf("firing a tick the schedule has passed: %+v, want store.ErrConflict", res)
		}
		if list := tasksOf(b, "every-minute"); len(list) != 1 {
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
		res := fire(b, "a", store.FireRequest{Name: "s", Epoch: held[0].Epoch, Fire: true,
			ScheduledFor: tick, Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Key: "s", Bucket: 1}})
		if res.Err != nil || res.Fired {
			t.Fatalf("firing an already-fired tick: %+v, want not fired and no error", res)
		}
		if list := tasksOf(b, "s"); len(list) != 1 {
			t.Errorf("%d tasks for one tick", len(list))
		}
		if s, _ := b.s.GetSchedule(b.ctx, "s"); !s.NextFireAt.Equal(tick.Add(time.Minute)) {
			t.Errorf("schedule did not advance: next %v", s.NextFireAt)
		}
	})

	t.Run("ABusyUniqueKeyPassesTheTick", func(t *testing.T) {
		// The previous run still holds the unique key: the tick is passed
		// over and the schedule moves on.
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		b.create(store.NewTask{Bucket: 1, UniqueKey: "report"})
		newSchedule(b, "busy", 1, tick)
		held := b.hold("a", 1)
		res := fire(b, "a", store.FireRequest{Name: "busy", Epoch: held[0].Epoch, Fire: true, ScheduledFor: tick,
			Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "noop", Bucket: 1, UniqueKey: "report"}})
		if res.Err != nil || res.Fired {
			t.Fatalf("firing while the unique key is busy: %+v", res)
		}
		if sc, _ := b.s.GetSchedule(b.ctx, "busy"); !sc.NextFireAt.Equal(tick.Add(time.Minute)) {
			t.Errorf("the busy schedule did not advance: %v", sc.NextFireAt)
		}
	})

	t.Run("AdvanceWithoutFiring", func(t *testing.T) {
		// Missed ticks under the skip policy: the schedule jumps ahead and
		// nothing is created.
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		stale := now.Add(-time.Hour).Truncate(time.Minute)
		newSchedule(b, "s", 1, stale)
		held := b.hold("a", 1)
		next := now.Add(time.Minute).Truncate(time.Minute)
		if res := fire(b, "a", store.FireRequest{Name: "s", Epoch: held[0].Epoch, From: stale, Next: next}); res.Err != nil || res.Fired {
			t.Fatalf("advance only: %+v", res)
		}
		s, _ := b.s.GetSchedule(b.ctx, "s")
		if !s.NextFireAt.Equal(next) || !s.LastFireAt.IsZero() {
			t.Errorf("after skipping: next %v last %v, want next %v and no last firing", s.NextFireAt, s.LastFireAt, next)
		}
		if list := tasksOf(b, "s"); len(list) != 0 {
			t.Errorf("skipping created %d tasks", len(list))
		}
	})

	t.Run("CatchUpFiresALaterTickFromTheStoredOne", func(t *testing.T) {
		// The latest policy: the compare-and-set is on the stored next fire
		// time, the task is for the most recent missed tick.
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		stale := now.Add(-time.Hour).Truncate(time.Minute)
		latest := now.Add(-time.Minute).Truncate(time.Minute)
		newSchedule(b, "s", 1, stale)
		held := b.hold("a", 1)
		res := fire(b, "a", store.FireRequest{Name: "s", Epoch: held[0].Epoch, From: stale, Fire: true,
			ScheduledFor: latest, Next: latest.Add(2 * time.Minute), Task: store.NewTask{Kind: "report", Bucket: 1}})
		if res.Err != nil || !res.Fired || !res.Task.ScheduledFor.Equal(latest) {
			t.Fatalf("catch-up firing: %+v, want the task of %v", res, latest)
		}
		if s, _ := b.s.GetSchedule(b.ctx, "s"); !s.LastFireAt.Equal(latest) {
			t.Errorf("last fire %v, want %v", s.LastFireAt, latest)
		}
	})

	t.Run("ABatchFailsRequestByRequest", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		for _, name := range []string{"ok", "stale", "paused"} {
			newSchedule(b, name, 1, tick)
		}
		newSchedule(b, "foreign", 2, tick)
		if _, err := b.s.SetScheduleEnabled(b.ctx, "paused", false, time.Time{}); err != nil {
			t.Fatal(err)
		}
		held := b.hold("a", 1)
		b.hold("b", 2)
		req := func(name string, from time.Time) store.FireRequest {
			return store.FireRequest{Name: name, Epoch: held[0].Epoch, From: from, Fire: true, ScheduledFor: tick,
				Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Key: name, Bucket: 1}}
		}
		foreign := req("foreign", tick)
		foreign.Task.Bucket = 2
		out, err := b.s.FireSchedules(b.ctx, "a", []store.FireRequest{
			req("ok", tick), req("stale", tick.Add(-time.Minute)), req("paused", tick), foreign, req("gone", tick),
		})
		if err != nil || len(out) != 5 {
			t.Fatalf("FireSchedules: %d results, %v", len(out), err)
		}
		for i, want := range []error{nil, store.ErrConflict, store.ErrConflict, store.ErrFenced, store.ErrNotFound} {
			if !errors.Is(out[i].Err, want) || (want == nil) != out[i].Fired {
				t.Errorf("request %d: %+v, want error %v", i, out[i], want)
			}
		}
		for _, name := range []string{"stale", "paused", "foreign"} {
			if list := tasksOf(b, name); len(list) != 0 {
				t.Errorf("refused request %s created %d tasks", name, len(list))
			}
			if s, _ := b.s.GetSchedule(b.ctx, name); !s.NextFireAt.Equal(tick) {
				t.Errorf("refused request %s moved its schedule to %v", name, s.NextFireAt)
			}
		}
	})

	t.Run("AnInvalidBatchWritesNothing", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "s", 1, tick)
		held := b.hold("a", 1)
		good := store.FireRequest{Name: "s", Epoch: held[0].Epoch, Fire: true, ScheduledFor: tick,
			Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Bucket: 1}}
		stuck := good
		stuck.Next = tick
		// Stores keep microseconds: this Next would be stored as the tick
		// itself, and the schedule fire it again and again.
		underMicro := good
		underMicro.Next = tick.Add(500 * time.Nanosecond)
		badTask := good
		badTask.Task.Payload = json.RawMessage(`{nope`)
		for name, batch := range map[string][]store.FireRequest{
			"a next fire time that does not move on":         {stuck},
			"a next fire time less than a microsecond later": {underMicro},
			"a schedule twice":                               {good, good},
			"an invalid payload":                             {badTask},
		} {
			if _, err := b.s.FireSchedules(b.ctx, "a", batch); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: %v, want store.ErrInvalid", name, err)
			}
		}
		if list := tasksOf(b, "s"); len(list) != 0 {
			t.Errorf("invalid batches created %d tasks", len(list))
		}
	})

	t.Run("OnlyTheHolderFires", func(t *testing.T) {
		b := setup(t, h)
		now, _ := b.s.Now(b.ctx)
		tick := now.Add(-time.Second).Truncate(time.Second)
		newSchedule(b, "s", 1, tick)
		held := b.hold("a", 1)
		fireAs := func(owner string, epoch int64) error {
			return fire(b, owner, store.FireRequest{Name: "s", Epoch: epoch, Fire: true, ScheduledFor: tick,
				Next: tick.Add(time.Minute), Task: store.NewTask{Kind: "report", Key: "s", Bucket: 1}}).Err
		}
		if err := fireAs("b", held[0].Epoch); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing by a non-holder: %v, want store.ErrFenced", err)
		}
		if err := fireAs("a", held[0].Epoch+1); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing under a wrong epoch: %v, want store.ErrFenced", err)
		}
		h.ExpireBucketLease(t, b.s, 1)
		if err := fireAs("a", held[0].Epoch); !errors.Is(err, store.ErrFenced) {
			t.Errorf("firing past the lease: %v, want store.ErrFenced", err)
		}
		if list := tasksOf(b, "s"); len(list) != 0 {
			t.Errorf("refused firings created %d tasks", len(list))
		}
		if s, _ := b.s.GetSchedule(b.ctx, "s"); !s.NextFireAt.Equal(tick) {
			t.Errorf("refused firings moved the schedule to %v", s.NextFireAt)
		}
	})
}
