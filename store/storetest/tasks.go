package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func testTasks(t *testing.T, h Harness) {
	t.Run("CreateAndGet", func(t *testing.T) {
		b := setup(t, h)
		before, _ := b.s.Now(b.ctx)
		created := b.create(
			store.NewTask{Kind: "email", Key: "user-1", Bucket: 3, Priority: 5, Payload: json.RawMessage(`{"to":"a@b"}`),
				MaxAttempts: 7, Timeout: 90 * time.Second},
			store.NewTask{Key: "user-2", Bucket: 4, Delay: time.Hour},
			store.NewTask{Key: "user-3", Bucket: 5, Pending: true},
		)
		if len(created) != 3 {
			t.Fatalf("created %d tasks, want 3", len(created))
		}
		if !(created[0].ID < created[1].ID && created[1].ID < created[2].ID) {
			t.Errorf("ids %v are not ascending in input order", ids(created))
		}
		first := b.get(created[0].ID)
		if first.Kind != "email" || first.Key != "user-1" || first.Bucket != 3 || first.Priority != 5 ||
			first.MaxAttempts != 7 || first.Timeout != 90*time.Second || first.Status != task.Queued ||
			first.StatusVersion != 1 || first.Attempt != 0 || first.ClaimSeq != 0 || first.Owner != "" {
			t.Errorf("first task read back as %+v", first)
		}
		var payload map[string]string
		if err := json.Unmarshal(first.Payload, &payload); err != nil || payload["to"] != "a@b" {
			t.Errorf("payload read back as %s (%v)", first.Payload, err)
		}
		if first.RunAt.Before(before.Add(-time.Second)) || first.CreatedAt.IsZero() {
			t.Errorf("queued task run_at %v / created_at %v, want about now (%v)", first.RunAt, first.CreatedAt, before)
		}
		second := b.get(created[1].ID)
		if second.Status != task.Scheduled || second.MaxAttempts != store.DefaultMaxAttempts {
			t.Errorf("delayed task: status %s, max attempts %d; want scheduled and %d",
				second.Status, second.MaxAttempts, store.DefaultMaxAttempts)
		}
		if d := second.RunAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("delayed task runs at %v, want about an hour after %v", second.RunAt, before)
		}
		if got := b.get(created[2].ID).Status; got != task.Pending {
			t.Errorf("pending task is %s", got)
		}
		_, err := b.s.GetTask(b.ctx, created[2].ID+1000)
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetTask of a missing id: %v, want store.ErrNotFound", err)
		}
	})

	t.Run("ReturnedTasksAreCopies", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 1, Payload: json.RawMessage(`{"a":1}`)})[0]
		created.Status = task.Succeeded
		created.Payload[1] = 'X'
		got := b.get(created.ID)
		if got.Status != task.Queued || string(got.Payload) != `{"a": 1}` && string(got.Payload) != `{"a":1}` {
			t.Errorf("mutating a returned task changed the store: %s %s", got.Status, got.Payload)
		}
	})

	t.Run("InvalidInputIsRefusedWhole", func(t *testing.T) {
		b := setup(t, h)
		cases := map[string]store.NewTask{
			"payload": {Kind: "noop", Key: "k", Bucket: 1, Payload: json.RawMessage(`{"a":`)},
			"kind":    {Kind: "", Key: "k", Bucket: 1},
			// What PostgreSQL itself refuses is refused before it, by every
			// store alike (store.CheckNewTasks).
			"key not UTF-8":      {Kind: "noop", Key: "a\xff", Bucket: 1},
			"payload NUL escape": {Kind: "noop", Key: "k", Bucket: 1, Payload: json.RawMessage(`{"a":"\u0000"}`)},
			"long unique key":    {Kind: "noop", Key: "k", Bucket: 1, UniqueKey: strings.Repeat("u", 4000)},
			"negative delay":     {Kind: "noop", Key: "k", Bucket: 1, Delay: -time.Second},
		}
		for name, bad := range cases {
			_, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "ok", Bucket: 1}, bad})
			if !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: CreateTasks = %v, want store.ErrInvalid", name, err)
			}
		}
		list, err := b.s.ListTasks(b.ctx, store.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 0 {
			t.Errorf("a refused batch left %d tasks behind", len(list))
		}
	})

	t.Run("UniqueKeyAmongUnfinishedTasks", func(t *testing.T) {
		b := setup(t, h)
		first := b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "report-2026-11"})[0]
		_, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1, UniqueKey: "report-2026-11"}})
		if !errors.Is(err, store.ErrDuplicate) {
			t.Fatalf("second task with the same unique key: %v, want store.ErrDuplicate", err)
		}
		if !strings.Contains(err.Error(), "report-2026-11") {
			t.Errorf("%q does not name the unique key", err)
		}
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: first.ID, Version: 1, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}
		b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "report-2026-11"})
	})

	t.Run("ADuplicateNamesTheTaskThatHoldsTheKey", func(t *testing.T) {
		// The refusal names the holder (not "task 0", nor the index of
		// the refused task), and says it in the store's words, not the
		// driver's.
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "other"})
		holder := b.create(store.NewTask{Key: "k", Bucket: 1, UniqueKey: "report"})[0]
		for _, batch := range [][]store.NewTask{
			{{Kind: "noop", Key: "k", Bucket: 1, UniqueKey: "report"}},
			{{Kind: "noop", Key: "k", Bucket: 2, UniqueKey: "fresh"}, {Kind: "noop", Key: "k", Bucket: 1, UniqueKey: "report"}},
		} {
			_, err := b.s.CreateTasks(b.ctx, batch)
			var dup *store.DuplicateError
			if !errors.As(err, &dup) || !errors.Is(err, store.ErrDuplicate) {
				t.Fatalf("a task whose unique key is held: %v, want a *store.DuplicateError", err)
			}
			wantIndex := len(batch) - 1
			if len(batch) == 1 {
				wantIndex = -1 // a batch of one has no index to name
			}
			if dup.Holder != holder.ID || dup.UniqueKey != "report" || dup.Index != wantIndex {
				t.Errorf("%+v: want unique key report held by task %d, the refused task at index %d", dup, holder.ID, wantIndex)
			}
			msg := err.Error()
			if !strings.Contains(msg, fmt.Sprintf("task %d", holder.ID)) {
				t.Errorf("%q does not name task %d, which holds the key", msg, holder.ID)
			}
			for _, driver := range []string{"constraint", "UNIQUE", "SQLSTATE", "violates", "23505", "(2067)"} {
				if strings.Contains(msg, driver) {
					t.Errorf("%q carries the driver's text %q", msg, driver)
				}
			}
		}
		if list, err := b.s.ListTasks(b.ctx, store.TaskFilter{}); err != nil || len(list) != 2 {
			t.Errorf("refused batches left %d tasks (%v), want the 2 created", len(list), err)
		}
	})

	t.Run("ListFiltersAndPages", func(t *testing.T) {
		b := setup(t, h)
		var batch []store.NewTask
		for i := 0; i < 25; i++ {
			nt := store.NewTask{Kind: "a", Key: "k-even", Bucket: i % numBuckets}
			if i%2 == 1 {
				nt.Kind, nt.Key = "b", "k-odd"
			}
			batch = append(batch, nt)
		}
		created := b.create(batch...)
		if _, err := b.s.Transition(b.ctx, store.Transition{ID: created[0].ID, Version: 1, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}

		count := func(f store.TaskFilter) int {
			t.Helper()
			f.Limit = 1000
			list, err := b.s.ListTasks(b.ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			return len(list)
		}
		low := bucket.Of(0, 1)
		for name, c := range map[string]struct {
			f    store.TaskFilter
			want int
		}{
			"all":       {store.TaskFilter{}, 25},
			"kind":      {store.TaskFilter{Kind: "b"}, 12},
			"key":       {store.TaskFilter{Key: "k-even"}, 13},
			"status":    {store.TaskFilter{Statuses: []task.Status{task.Cancelled}}, 1},
			"statuses":  {store.TaskFilter{Statuses: []task.Status{task.Cancelled, task.Queued}}, 25},
			"buckets":   {store.TaskFilter{Buckets: &low}, 7}, // ids 0,1,8,9,16,17,24
			"combined":  {store.TaskFilter{Kind: "a", Buckets: &low}, 4},
			"schedule":  {store.TaskFilter{Schedule: "nightly"}, 0},
			"no match":  {store.TaskFilter{Kind: "c"}, 0},
			"by status": {store.TaskFilter{Statuses: []task.Status{task.Queued}, Kind: "a"}, 12},
		} {
			if got := count(c.f); got != c.want {
				t.Errorf("%s: %d tasks, want %d", name, got, c.want)
			}
		}

		var seen []int64
		cursor := int64(0)
		for page := 0; page < 10; page++ {
			list, err := b.s.ListTasks(b.ctx, store.TaskFilter{Limit: 10, BeforeID: cursor})
			if err != nil {
				t.Fatal(err)
			}
			if len(list) == 0 {
				break
			}
			seen = append(seen, ids(list)...)
			cursor = list[len(list)-1].ID
		}
		if len(seen) != 25 {
			t.Fatalf("paging saw %d tasks, want 25", len(seen))
		}
		for i := 1; i < len(seen); i++ {
			if seen[i] >= seen[i-1] {
				t.Fatalf("pages are not newest first without repeats: %v", seen)
			}
		}
	})

	t.Run("Backlog", func(t *testing.T) {
		b := setup(t, h)
		b.create(
			store.NewTask{Key: "k", Bucket: 2},
			store.NewTask{Key: "k", Bucket: 2},
			store.NewTask{Key: "k", Bucket: 2, Delay: time.Hour},
			store.NewTask{Key: "k", Bucket: 5},
		)
		held := b.hold("a", 5)
		b.claim("a", held, 10)
		backlog, err := b.s.BucketBacklog(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int]store.Backlog{}
		for _, bl := range backlog {
			bl.OldestDue = time.Time{} // checked in Filters/OldestDue
			got[bl.Bucket] = bl
		}
		if got[2] != (store.Backlog{Bucket: 2, Queued: 2, Waiting: 1}) {
			t.Errorf("bucket 2 backlog %+v, want 2 queued and 1 waiting", got[2])
		}
		if got[5] != (store.Backlog{Bucket: 5, Active: 1}) {
			t.Errorf("bucket 5 backlog %+v, want 1 active", got[5])
		}
		if _, ok := got[0]; ok {
			t.Errorf("an empty bucket is reported: %+v", got[0])
		}
	})

	t.Run("TimeoutsAStoreCannotKeepAreRefused", func(t *testing.T) {
		b := setup(t, h)
		now, err := b.s.Now(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []time.Duration{time.Nanosecond, 999 * time.Microsecond, 1500 * time.Microsecond, -time.Millisecond} {
			_, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1, Timeout: d}})
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), d.String()) {
				t.Errorf("a task with timeout %v: %v, want store.ErrInvalid naming %v", d, err, d)
			}
			_, err = b.s.UpsertSchedule(b.ctx, store.Schedule{Name: "s", Spec: "@every 1m", Kind: "noop", Key: "s",
				Bucket: 1, Timeout: d, Enabled: true, NextFireAt: now}, store.UpsertCreate)
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), d.String()) {
				t.Errorf("a schedule with timeout %v: %v, want store.ErrInvalid naming %v", d, err, d)
			}
		}
		list, err := b.s.ListTasks(b.ctx, store.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 0 {
			t.Errorf("refused timeouts left %d tasks behind", len(list))
		}
		for _, d := range []time.Duration{0, time.Millisecond, 1500 * time.Millisecond} {
			created := b.create(store.NewTask{Key: "k", Bucket: 1, Timeout: d})[0]
			if got := b.get(created.ID).Timeout; got != d {
				t.Errorf("a task created with timeout %v reads back with %v", d, got)
			}
		}
	})
}
