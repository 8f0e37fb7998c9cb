package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
)

func testNotifications(t *testing.T, h Harness) {
	b := setup(t, h)
	n, ok := b.s.(store.Notifier)
	if !ok {
		// Stores without notifications are polled; the rest of the suite is
		// their whole contract.
		return
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	sub, err := n.Listen(ctx, store.TopicTasks, store.TopicCommands, store.TopicSchedules, store.TopicBuckets)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	expect := func(topic store.Topic, what string) store.Notification {
		t.Helper()
		timeout := time.After(patience.Scale(30 * time.Second))
		for {
			select {
			case got, open := <-sub.C():
				if !open {
					t.Fatalf("subscription closed while waiting for %s", what)
				}
				if got.Topic == topic {
					return got
				}
			case <-timeout:
				t.Fatalf("no %s notification for %s", topic, what)
			}
		}
	}

	// A subscription may need a moment to be in place; tasks created before
	// that are not announced to it, so keep creating until one is.
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	var got store.Notification
	for {
		b.create(store.NewTask{Key: "k", Bucket: 3}, store.NewTask{Key: "k", Bucket: 5})
		select {
		case got = <-sub.C():
		case <-time.After(200 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no notification for new tasks")
			}
			continue
		}
		break
	}
	if got.Topic != store.TopicTasks {
		t.Fatalf("first notification %+v, want %s", got, store.TopicTasks)
	}
	if set, err := bucket.ParseSet(got.Payload, numBuckets); err != nil || !set.Equal(bucket.Of(3, 5)) {
		t.Errorf("new-task payload %q, want the buckets 3,5", got.Payload)
	}

	running, _ := b.runningTask("a", 1)
	b.create(store.NewTask{Key: "k", Bucket: 2, Delay: time.Hour}) // not due: no need to wake anyone
	cmd, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop,
		IssuedBy: "ops", Reason: "wrong order, " + strings.Repeat("ü", 2*store.NoteTextRunes)})
	if err != nil {
		t.Fatal(err)
	}
	// The note names the attempt the stop is for, so that its holder can
	// cancel the handler before it reads the command.
	// It carries the command's issue time, to the microsecond, so that the
	// node times the stop's delivery when it acts on the note alone, and
	// who asked and why (the start of a long reason) for the task's trail.
	want := store.CommandNote{ID: cmd.ID, Owner: running.Owner, TaskID: running.ID, ClaimSeq: running.ClaimSeq, Kind: store.CommandStop,
		IssuedAt: cmd.IssuedAt.Truncate(time.Microsecond), IssuedBy: "ops",
		Reason: string([]rune(cmd.Reason)[:store.NoteTextRunes])}
	if note, err := store.ParseCommandNote(expect(store.TopicCommands, "a stop").Payload); err != nil || note.ID != want.ID ||
		note.Owner != want.Owner || note.TaskID != want.TaskID || note.ClaimSeq != want.ClaimSeq || note.Kind != want.Kind ||
		!note.IssuedAt.Equal(want.IssuedAt) || note.IssuedBy != want.IssuedBy || note.Reason != want.Reason {
		t.Errorf("stop note %+v (%v), want %+v", note, err, want)
	}
	// A schedule created, or resumed, may tick sooner than its holder
	// planned to look.
	now, _ := b.s.Now(b.ctx)
	if _, err := b.s.UpsertSchedule(b.ctx, store.Schedule{Name: "s", Spec: "@every 1m", CatchUp: store.CatchUpSkip,
		Kind: "report", Key: "s", Bucket: 6, MaxAttempts: 1, Enabled: true, NextFireAt: now.Add(time.Minute)},
		store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	if sc := expect(store.TopicSchedules, "a new schedule"); sc.Payload != "6" {
		t.Errorf("new schedule payload %q, want 6", sc.Payload)
	}
	if _, err := b.s.SetScheduleEnabled(b.ctx, "s", false, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.s.SetScheduleEnabled(b.ctx, "s", true, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if sc := expect(store.TopicSchedules, "a resumed schedule"); sc.Payload != "6" {
		t.Errorf("resumed schedule payload %q, want 6", sc.Payload)
	}
	if _, err := b.s.ReleaseBuckets(b.ctx, "a", bucket.Set{}); err != nil {
		t.Fatal(err)
	}
	if rel := expect(store.TopicBuckets, "a release"); rel.Payload != "1" {
		t.Errorf("release payload %q, want 1", rel.Payload)
	}
	// A hand-off wakes its successor (and any standby) at once.
	held := b.hold("a", 4, 5)
	if _, err := b.s.HandOff(b.ctx, "a", []store.Handoff{
		{Bucket: 4, Epoch: held[0].Epoch, To: "b", ToNode: nodeOf("b")},
		{Bucket: 5, Epoch: held[1].Epoch, To: "b", ToNode: nodeOf("b")},
	}, leaseTTL); err != nil {
		t.Fatal(err)
	}
	if ho := expect(store.TopicBuckets, "a hand-off"); ho.Payload != "4-5" {
		t.Errorf("hand-off payload %q, want 4-5", ho.Payload)
	}
	// A pin moves its buckets at once.
	if err := b.s.PinBuckets(b.ctx, bucket.Of(6, 7), "node-b"); err != nil {
		t.Fatal(err)
	}
	if pin := expect(store.TopicBuckets, "a pin"); pin.Payload != "6-7" {
		t.Errorf("pin payload %q, want 6-7", pin.Payload)
	}

	cancel()
	select {
	case _, open := <-sub.C():
		for open {
			_, open = <-sub.C()
		}
	case <-time.After(patience.Scale(30 * time.Second)):
		t.Fatal("the subscription did not end with its context")
	}
}
