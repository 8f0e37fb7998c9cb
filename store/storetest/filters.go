package storetest

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testFilters covers what an operator's view asks of ListTasks and
// BucketBacklog beyond the plain filters: payload containment, the node that
// ran a task, keyset pages under those filters, and the age of the oldest
// due task of a bucket.
func testFilters(t *testing.T, h Harness) {
	t.Run("PayloadContainment", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(
			store.NewTask{Key: "k", Bucket: 1, Payload: json.RawMessage(`{"customer": 7, "plan": "pro"}`)},
			store.NewTask{Key: "k", Bucket: 1, Payload: json.RawMessage(`{"customer": 8}`)},
			store.NewTask{Key: "k", Bucket: 2, Payload: json.RawMessage(`{"customer": 7, "tags": ["a", "b"], "addr": {"city": "Oslo", "zip": "0150"}}`)},
			store.NewTask{Key: "k", Bucket: 2, Payload: json.RawMessage(`["x", "y"]`)},
			store.NewTask{Key: "k", Bucket: 2},
			store.NewTask{Key: "k", Bucket: 2, Payload: json.RawMessage(`{"customer": "7"}`)},
		)
		cases := []struct {
			filter string
			want   []int64
		}{
			{`{"customer": 7}`, []int64{created[2].ID, created[0].ID}},
			{`{"customer": "7"}`, []int64{created[5].ID}},
			{`{"customer": 7, "plan": "pro"}`, []int64{created[0].ID}},
			{`{"tags": ["b"]}`, []int64{created[2].ID}},
			{`{"addr": {"city": "Oslo"}}`, []int64{created[2].ID}},
			{`"x"`, []int64{created[3].ID}},
			{`["y"]`, []int64{created[3].ID}},
			{`{"customer": 9}`, []int64{}},
			{`{}`, []int64{created[5].ID, created[2].ID, created[1].ID, created[0].ID}},
		}
		for _, c := range cases {
			got, err := b.s.ListTasks(b.ctx, store.TaskFilter{Payload: json.RawMessage(c.filter)})
			if err != nil {
				t.Fatalf("payload %s: %v", c.filter, err)
			}
			if !slices.Equal(ids(got), c.want) {
				t.Errorf("payload %s: got tasks %v, want %v", c.filter, ids(got), c.want)
			}
		}
		_, err := b.s.ListTasks(b.ctx, store.TaskFilter{Payload: json.RawMessage(`{"customer": `)})
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), `{"customer": `) {
			t.Errorf("an invalid payload filter: %v, want store.ErrInvalid naming it", err)
		}
	})

	t.Run("PayloadPagesByKeyset", func(t *testing.T) {
		b := setup(t, h)
		var want []int64
		for i := range 7 {
			p := json.RawMessage(`{"customer": 1}`)
			if i%2 == 1 {
				p = json.RawMessage(`{"customer": 2}`)
			}
			tk := b.create(store.NewTask{Key: "k", Bucket: i % 3, Payload: p})[0]
			if i%2 == 0 {
				want = append([]int64{tk.ID}, want...)
			}
		}
		var seen []int64
		var before int64
		for {
			page, err := b.s.ListTasks(b.ctx, store.TaskFilter{Payload: json.RawMessage(`{"customer": 1}`), BeforeID: before, Limit: 3})
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, ids(page)...)
			if len(page) < 3 {
				break
			}
			before = page[len(page)-1].ID
		}
		if !slices.Equal(seen, want) {
			t.Errorf("pages of {customer: 1}: %v, want %v", seen, want)
		}
	})

	t.Run("Node", func(t *testing.T) {
		b := setup(t, h)
		b.create(store.NewTask{Key: "k", Bucket: 1}, store.NewTask{Key: "k", Bucket: 3}, store.NewTask{Key: "k", Bucket: 3})
		ranOnA := b.claim("a", b.hold("a", 1), 10)
		b.claim("b", b.hold("b", 3), 1)
		got, err := b.s.ListTasks(b.ctx, store.TaskFilter{Node: nodeOf("a")})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), ids(ranOnA)) {
			t.Errorf("tasks of node %s: %v, want %v", nodeOf("a"), ids(got), ids(ranOnA))
		}
		got, err = b.s.ListTasks(b.ctx, store.TaskFilter{Node: nodeOf("b"), Statuses: []task.Status{task.Queued}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Errorf("queued tasks of node %s: %v, want none", nodeOf("b"), ids(got))
		}
	})

	t.Run("OldestDue", func(t *testing.T) {
		b := setup(t, h)
		// A past run_at means due at once, so the oldest is the first
		// created.
		old := b.create(store.NewTask{Key: "k", Bucket: 4})[0].RunAt
		b.create(
			store.NewTask{Key: "k", Bucket: 4},
			store.NewTask{Key: "k", Bucket: 4, Delay: time.Hour},
			store.NewTask{Key: "k", Bucket: 6, Delay: time.Hour},
		)
		backlog, err := b.s.BucketBacklog(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int]store.Backlog{}
		for _, bl := range backlog {
			got[bl.Bucket] = bl
		}
		if !got[4].OldestDue.Equal(old) {
			t.Errorf("bucket 4's oldest due task: %v, want %v", got[4].OldestDue, old)
		}
		if !got[6].OldestDue.IsZero() {
			t.Errorf("bucket 6 has nothing due, yet its oldest due task is at %v", got[6].OldestDue)
		}
	})
}
