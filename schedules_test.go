package flotilla_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

func TestSchedulesReportWhoFiresThem(t *testing.T) {
	b := setup(t)
	b.startNode(t) // holds 0-31, runs "work"
	p := b.client.Policy()
	low, high := keyIn(t, p, span(0, 31)), keyIn(t, p, span(32, 63))
	for _, d := range []schedule.Definition{
		{Name: "served", Key: low, Every: time.Minute, Kind: "work"},
		{Name: "unknown-kind", Key: low, Every: time.Minute, Kind: "resize"},
		{Name: "unheld", Key: high, Every: time.Minute, Kind: "work"},
	} {
		if _, err := b.client.AddSchedule(b.ctx, d, store.UpsertCreate); err != nil {
			t.Fatal(err)
		}
	}
	list, err := b.client.Schedules(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ holder, waiting string }{
		"served":       {"low", ""},
		"unknown-kind": {"low", `does not run kind "resize"`},
		"unheld":       {"", "no live node holds bucket"},
	}
	if len(list) != len(want) {
		t.Fatalf("%d schedules listed, want %d", len(list), len(want))
	}
	for _, r := range list {
		w := want[r.Name]
		if r.Holder != w.holder || (w.waiting == "") != (r.Waiting == "") || !strings.Contains(r.Waiting, w.waiting) {
			t.Errorf("%s: holder %q waiting %q, want holder %q waiting %q", r.Name, r.Holder, r.Waiting, w.holder, w.waiting)
		}
	}
}

func TestAddScheduleRefusesBadDefinitionsAndDuplicates(t *testing.T) {
	b := setup(t)
	_, err := b.client.AddSchedule(b.ctx, schedule.Definition{Name: "x", Cron: "every day", Kind: "work"}, store.UpsertCreate)
	if !errors.Is(err, schedule.ErrInvalidSpec) || !strings.Contains(err.Error(), "every day") {
		t.Errorf("an invalid cron expression: %v, want schedule.ErrInvalidSpec naming it", err)
	}
	ok := schedule.Definition{Name: "x", Every: time.Hour, Kind: "work"}
	if _, err := b.client.AddSchedule(b.ctx, ok, store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.AddSchedule(b.ctx, ok, store.UpsertCreate); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("adding a name twice: %v, want store.ErrDuplicate", err)
	}
	if list, _ := b.client.Schedules(b.ctx); len(list) != 1 {
		t.Errorf("%d schedules, want 1", len(list))
	}
}

func TestResumeSkipsTheTicksOfThePause(t *testing.T) {
	b := setup(t)
	r, err := b.client.AddSchedule(b.ctx, schedule.Definition{Name: "x", Every: time.Second, Kind: "work"}, store.UpsertCreate)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.PauseSchedule(b.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	// Past the stored tick, as after a long pause.
	eventually(t, "the database clock passes the stored tick", func() bool {
		now, err := b.store.Now(b.ctx)
		return err == nil && now.After(r.NextFireAt.Add(time.Second))
	})
	resumed, err := b.client.ResumeSchedule(b.ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	now, _ := b.store.Now(b.ctx)
	if !resumed.Enabled || !resumed.NextFireAt.After(r.NextFireAt) || resumed.NextFireAt.Before(now.Add(-time.Second)) {
		t.Errorf("resumed with next %v (was %v, now %v), want the first tick after the resume", resumed.NextFireAt,
			r.NextFireAt, now)
	}
	if err := b.client.RemoveSchedule(b.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.ResumeSchedule(b.ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("resuming a removed schedule: %v, want store.ErrNotFound", err)
	}
}

func TestAddScheduleReplaceKeepsAPauseUnlessToldOtherwise(t *testing.T) {
	b := setup(t)
	d := schedule.Definition{Name: "x", Every: time.Hour, Kind: "work"}
	if _, err := b.client.AddSchedule(b.ctx, d, store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.PauseSchedule(b.ctx, "x"); err != nil {
		t.Fatal(err)
	}
	d.Priority = 5
	r, err := b.client.AddSchedule(b.ctx, d, store.UpsertReplace)
	if err != nil || r.Enabled || r.Priority != 5 {
		t.Fatalf("replaced: enabled %v priority %d (%v), want still paused with priority 5", r.Enabled, r.Priority, err)
	}
	if r, err = b.client.AddSchedule(b.ctx, d, store.UpsertReplaceEnabled); err != nil || !r.Enabled {
		t.Fatalf("replaced and resumed: enabled %v (%v), want running", r.Enabled, err)
	}
	d.Paused = true
	if r, err = b.client.AddSchedule(b.ctx, d, store.UpsertReplace); err != nil || !r.Enabled {
		t.Fatalf("replaced by a paused definition: enabled %v (%v), want still running", r.Enabled, err)
	}
	if r, err = b.client.AddSchedule(b.ctx, d, store.UpsertReplaceEnabled); err != nil || r.Enabled {
		t.Fatalf("replaced and paused: enabled %v (%v), want paused", r.Enabled, err)
	}
	if _, err = b.client.AddSchedule(b.ctx, d, store.UpsertMode(-1)); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("an unknown mode: %v, want store.ErrInvalid", err)
	}
}
