package node

import (
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A holder writes on each waiting row why it waits: its key's own limit,
// its kind's fleet-wide share, or resources the node does not have free.
func TestLimitHolderWritesWhyTasksWait(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
	cfg.BucketLeaseTTL = time.Second
	cfg.Capacity = store.Resources{"gpu": 1}
	cfg.Limits = []store.Limit{
		{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 1},
		{Name: "trainers", Kind: "train", Per: store.PerFleet, Concurrency: 1},
	}
	gate := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{"fetch": led.handler(gate), "train": led.handler(gate),
		"render": led.handler(gate)})
	submit(t, n, SubmitRequest{Kind: "fetch", Key: "f1", LimitKey: "tenant-7"})
	fetchWaits := submit(t, n, SubmitRequest{Kind: "fetch", Key: "f2", LimitKey: "tenant-7"})
	submit(t, n, SubmitRequest{Kind: "train", Key: "t1"})
	trainWaits := submit(t, n, SubmitRequest{Kind: "train", Key: "t2"})
	tooBig := submit(t, n, SubmitRequest{Kind: "render", Key: "r1", Resources: store.Resources{"gpu": 2}})
	eventually(t, "one fetch and one train running", func() bool { return led.started() == 2 })

	want := map[int64]string{
		fetchWaits.ID: "concurrency limit api: tenant-7 at 1/1",
		trainWaits.ID: "fleet limit trainers: train at this holder's share of 1",
		tooBig.ID:     "resources: more than node n1 has free (capacity gpu=1)",
	}
	for id, reason := range want {
		eventually(t, "the reason "+reason, func() bool { return b.get(t, id).WaitReason == reason })
	}
	close(gate)
	eventually(t, "the fetch and train tasks all start", func() bool { return led.started() == 4 })
	for _, id := range []int64{fetchWaits.ID, trainWaits.ID} {
		if got := b.get(t, id).WaitReason; got != "" {
			t.Errorf("task %d started with its wait reason left: %q", id, got)
		}
	}
}

// A node with limits but no capacity runs no task that needs a resource,
// and says so on the task.
func TestLimitNodeWithoutCapacitySaysSo(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "n1")
	cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
	cfg.BucketLeaseTTL = time.Second
	cfg.Limits = []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 1}}
	n := b.startNode(t, cfg, map[string]Handler{"fetch": newLedger().handler(nil)})
	needs := submit(t, n, SubmitRequest{Kind: "fetch", Key: "g", Resources: store.Resources{"gpu": 1}})
	const reason = "resources: node n1 declares no capacity (node.Config.Capacity)"
	eventually(t, "the reason "+reason, func() bool { return b.get(t, needs.ID).WaitReason == reason })
}

// A node with no limit and no capacity, as nodes are by default, takes no
// task that needs a resource (its plain claim passes over them), and says
// so on the task rather than leave it waiting without a word; a task that
// needs nothing runs beside it.
func TestNodeWithoutLimitsSaysWhyATaskNeedingResourcesWaits(t *testing.T) {
	b := setup(t)
	led := newLedger()
	cfg := b.config(t, "n1")
	cfg.BucketLeaseHeartbeat = 50 * time.Millisecond
	cfg.BucketLeaseTTL = time.Second
	n := b.startNode(t, cfg, map[string]Handler{"render": led.handler(nil)})
	needs := submit(t, n, SubmitRequest{Kind: "render", Key: "g", Resources: store.Resources{"gpu": 1}})
	plain := submit(t, n, SubmitRequest{Kind: "render", Key: "p"})
	const reason = "resources: node n1 declares no capacity (node.Config.Capacity)"
	eventually(t, "the reason "+reason, func() bool { return b.get(t, needs.ID).WaitReason == reason })
	eventually(t, "the task needing nothing to succeed", func() bool { return b.get(t, plain.ID).Status == task.Succeeded })
	if got := b.get(t, needs.ID).Status; got != task.Queued {
		t.Errorf("the task needing gpu=1 is %s on a node with no capacity, want queued", got)
	}
	if got := b.get(t, plain.ID).WaitReason; got != "" {
		t.Errorf("the task needing nothing has the wait reason %q", got)
	}
	if got := led.started(); got != 1 {
		t.Errorf("%d handlers started, want 1", got)
	}
}

// When the last limit naming its kinds is removed, the node reports that
// no limit is in use any more, so that the removed limit's gauges go.
func TestLimitUseIsClearedWhenTheLastLimitGoes(t *testing.T) {
	b := setup(t)
	reports := &limitReports{sum: map[string]int{}}
	cfg := b.config(t, "n1")
	cfg.Metrics = reports
	cfg.Limits = []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}}
	n := b.startNode(t, cfg, map[string]Handler{"fetch": newLedger().handler(nil)})
	n.limitPass(b.ctx)
	if got := reports.reported(); len(got) != 1 || got[0].Limit != "api" {
		t.Fatalf("reported %+v, want the use of api", got)
	}
	if err := b.store.DeleteLimit(b.ctx, "api"); err != nil {
		t.Fatal(err)
	}
	n.limitPass(b.ctx)
	if got := reports.reported(); len(got) != 0 {
		t.Errorf("after api was removed the node reported %+v, want no limit in use", got)
	}
	if got := n.LimitUse(); len(got) != 0 {
		t.Errorf("LimitUse() = %+v after api was removed", got)
	}
}
