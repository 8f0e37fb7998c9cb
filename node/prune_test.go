package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

func TestTheRetentionLoopPrunesFinishedTasksOfHeldBucketsPastTheirAge(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.config(t, "solo")
	cfg.PruneInterval = time.Minute
	cfg.PruneBatch = 1 // one pass needs several batches
	cfg.Retention = store.Retention{
		Ages:  store.Ages{task.Succeeded: 10 * time.Minute},
		Kinds: map[string]store.Ages{"audit": {task.Succeeded: 0}},
	}
	ok := func(context.Context, *task.Task) error { return nil }
	n := b.startNode(t, cfg, map[string]Handler{"work": ok, "audit": ok,
		"broken": func(context.Context, *task.Task) error { return fmt.Errorf("bad input: %w", task.ErrNoRetry) }})
	var pruned, kept []int64
	for _, key := range []string{"a", "b", "c"} {
		pruned = append(pruned, submit(t, n, SubmitRequest{Kind: "work", Key: key}).ID)
	}
	kept = append(kept, submit(t, n, SubmitRequest{Kind: "audit", Key: "a"}).ID)
	kept = append(kept, submit(t, n, SubmitRequest{Kind: "broken", Key: "b", MaxAttempts: 1}).ID)
	eventually(t, "every task finished", func() bool {
		for _, id := range append(append([]int64(nil), pruned...), kept...) {
			if !b.get(t, id).Status.Terminal() {
				return false
			}
		}
		return true
	})

	gone := func() bool {
		for _, id := range pruned {
			if _, err := b.store.GetTask(b.ctx, id); !errors.Is(err, store.ErrNotFound) {
				return false
			}
		}
		return true
	}
	passes := n.pruner.passes.Load()
	b.manual.Advance(9 * time.Minute)
	eventually(t, "a retention pass before the age has passed", func() bool { return n.pruner.passes.Load() > passes })
	for _, id := range pruned {
		if _, err := b.store.GetTask(b.ctx, id); err != nil {
			t.Fatalf("task %d pruned before its 10 minutes: %v", id, err)
		}
	}
	b.advanceUntil(t, "the succeeded work tasks are pruned", 30*time.Second, gone)
	for _, id := range kept {
		if _, err := b.store.GetTask(b.ctx, id); err != nil {
			t.Errorf("task %d (kept forever, or failed with a week to go) was pruned: %v", id, err)
		}
	}
	if got := b.get(t, kept[1]).Status; got != task.Failed {
		t.Errorf("the broken task is %s, want failed", got)
	}
}

func TestRetentionConfigIsCheckedAndDefaulted(t *testing.T) {
	s := memory.New()
	defer s.Close()
	n, err := New(s, Config{AllBuckets: true, Retention: store.Retention{Ages: store.Ages{task.Failed: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.cfg.Retention.Age("x", task.Failed); got != time.Hour {
		t.Errorf("failed kept %v, want the hour asked for", got)
	}
	if got := n.cfg.Retention.Age("x", task.Succeeded); got != store.DefaultRetainSucceeded {
		t.Errorf("succeeded kept %v, want the default %v", got, store.DefaultRetainSucceeded)
	}
	if n.cfg.PruneInterval != DefaultPruneInterval || n.cfg.PruneBatch != DefaultPruneBatch {
		t.Errorf("PruneInterval %v, PruneBatch %d; want the defaults", n.cfg.PruneInterval, n.cfg.PruneBatch)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{AllBuckets: true, PruneBatch: store.MaxPruneBatch + 1}, "PruneBatch"},
		{Config{AllBuckets: true, PruneInterval: -time.Second}, "PruneInterval"},
		{Config{AllBuckets: true, Retention: store.Retention{Ages: store.Ages{task.Running: time.Hour}}}, "running"},
		{Config{AllBuckets: true, Retention: store.Retention{Ages: store.Ages{task.Failed: -time.Hour}}}, "negative"},
	} {
		if _, err := New(s, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}
