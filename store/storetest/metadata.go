package storetest

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testMetadata holds what every store does with a task's metadata: it is
// kept as given, read back by every read of the task (the claim included,
// since the attempt needs it to run), never shared with the caller's map,
// and refused whole when some store could not keep it.
func testMetadata(t *testing.T, h Harness) {
	traced := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"request-id":  "req-7 ünïcode",
	}

	t.Run("KeptAndReadBackByEveryRead", func(t *testing.T) {
		b := setup(t, h)
		given := maps.Clone(traced)
		created := b.create(
			store.NewTask{Key: "k", Bucket: 1, Metadata: given},
			store.NewTask{Key: "k", Bucket: 1},
			store.NewTask{Key: "k", Bucket: 1, Metadata: map[string]string{}},
		)
		given["traceparent"] = "changed by the caller after the submit"
		want := []map[string]string{traced, nil, nil}
		check := func(how string, got *task.Task) {
			t.Helper()
			i := int(got.ID - created[0].ID)
			if !maps.Equal(got.Metadata, want[i]) || (want[i] == nil) != (got.Metadata == nil) {
				t.Errorf("%s: task %d has metadata %v, want %v", how, got.ID, got.Metadata, want[i])
			}
		}
		for _, c := range created {
			check("CreateTasks", c)
			check("GetTask", b.get(c.ID))
		}
		list, err := b.s.ListTasks(b.ctx, store.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			check("ListTasks", c)
		}
		claimed := b.claim("a", b.hold("a", 1), 10)
		if len(claimed) != 3 {
			t.Fatalf("claimed %v, want all 3 tasks", ids(claimed))
		}
		for _, c := range claimed {
			check("ClaimTasks", c)
		}
		claimed[0].Metadata["request-id"] = "changed by the reader"
		check("GetTask after a reader changed its copy", b.get(created[0].ID))
	})

	t.Run("KeptInLargeBatches", func(t *testing.T) {
		// A large batch may be loaded another way (PostgreSQL's COPY).
		b := setup(t, h)
		batch := make([]store.NewTask, 150)
		for i := range batch {
			batch[i] = store.NewTask{Key: "k", Bucket: 2, Metadata: map[string]string{"n": fmt.Sprint(i)}}
		}
		batch[7].Metadata = nil
		created := b.create(batch...)
		for i, c := range []*task.Task{created[0], created[7], created[149]} {
			want := batch[[]int{0, 7, 149}[i]].Metadata
			if got := b.get(c.ID).Metadata; !maps.Equal(got, want) || (want == nil) != (got == nil) {
				t.Errorf("task %d of a batch of 150: metadata %v, want %v", c.ID, got, want)
			}
		}
	})

	t.Run("ClaimedByTheLimitedClaim", func(t *testing.T) {
		b := setup(t, h)
		created := b.create(store.NewTask{Key: "k", Bucket: 3, Metadata: traced, Resources: store.Resources{"gpu": 1}})[0]
		claimed := b.claimLimited("a", b.hold("a", 3), 1, store.LimitedClaim{Free: store.Resources{"gpu": 1}})
		if len(claimed) != 1 || claimed[0].ID != created.ID || !maps.Equal(claimed[0].Metadata, traced) {
			t.Fatalf("the limited claim returned %+v, want task %d with metadata %v", claimed, created.ID, traced)
		}
	})

	t.Run("WhatNoStoreCouldKeepIsRefusedWhole", func(t *testing.T) {
		b := setup(t, h)
		tooMany := map[string]string{}
		for i := range store.MaxMetadataEntries + 1 {
			tooMany[fmt.Sprint("k", i)] = "v"
		}
		cases := map[string]struct {
			md    map[string]string
			names string
		}{
			"empty key":      {map[string]string{"": "v"}, "metadata key"},
			"key not UTF-8":  {map[string]string{"a\xff": "v"}, "metadata key"},
			"NUL in a value": {map[string]string{"k": "a\x00b"}, `metadata value of "k"`},
			"too many":       {tooMany, "metadata entry count"},
			"too large":      {map[string]string{"k": strings.Repeat("v", store.MaxMetadataBytes)}, "metadata size"},
		}
		for name, c := range cases {
			_, err := b.s.CreateTasks(b.ctx, []store.NewTask{
				{Kind: "noop", Key: "ok", Bucket: 1},
				{Kind: "noop", Key: "k", Bucket: 1, Metadata: c.md},
			})
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), c.names) {
				t.Errorf("%s: CreateTasks = %v, want store.ErrInvalid naming %s", name, err, c.names)
			}
		}
		list, err := b.s.ListTasks(b.ctx, store.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 0 {
			t.Errorf("refused batches left %d tasks behind", len(list))
		}
	})
}
