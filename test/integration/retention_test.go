package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestRetentionPrunesEachBucketByItsHolderThroughATakeover: two `worker run`
// processes keep succeeded noop tasks for two seconds and sleep tasks
// forever. Each prunes the buckets it holds; when one is killed with
// SIGKILL, the other takes its buckets and prunes what it runs there.
// Nothing of a pruned task is left behind (events, commands), and the
// tasks kept forever stay.
func TestRetentionPrunesEachBucketByItsHolderThroughATakeover(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	needsPostgres(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	retain := []string{"--retain", "all=2s", "--retain-kind", "sleep:all=0", "--prune-interval", "300ms"}
	doomed := f.worker(append([]string{"run", "--buckets", "0-31", "--node-id", "doomed", "--bucket-lease-ttl", leaseTTL(2 * time.Second).String(),
		"--no-balance"}, retain...)...)
	// The survivor declares every bucket: it starts once doomed holds its
	// own, or it could take them first and leave doomed standing by.
	f.waitUntilHeld("doomed", low, startWithin)
	f.worker(append([]string{"run", "--buckets", "0-63", "--node-id", "survivor", "--no-balance"}, retain...)...)
	f.waitUntilHeld("survivor", high, startWithin)

	ctx := t.Context()
	submit := func(kind, prefix string, n int, payload string) []int64 {
		t.Helper()
		reqs := make([]flotilla.TaskRequest, n)
		for i := range reqs {
			set := low
			if i%2 == 1 {
				set = high
			}
			reqs[i] = flotilla.TaskRequest{Kind: kind, Key: keyIn(t, f.policy, set, fmt.Sprintf("%s-%d", prefix, i))}
			if payload != "" {
				reqs[i].Payload = []byte(payload)
			}
		}
		tks, err := f.client.SubmitMany(ctx, reqs, flotilla.AllowUnowned())
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, len(tks))
		for i, tk := range tks {
			ids[i] = tk.ID
		}
		return ids
	}
	kept := submit("sleep", "kept", 4, `{"duration":"0s"}`)
	submit("noop", "first", 60, "")
	noopLeft := func() int {
		left, err := f.list(store.TaskFilter{Kind: "noop", Limit: 1000})
		if err != nil {
			return -1
		}
		return len(left)
	}
	eventually(t, 60*time.Second, "both holders prune the first noop tasks", func() bool { return noopLeft() == 0 })

	doomed.kill9()
	second := submit("noop", "second", 40, "")
	eventually(t, 60*time.Second, "the survivor takes the dead node's buckets, runs and prunes the second tasks",
		func() bool { return noopLeft() == 0 })
	for _, id := range second {
		if _, err := f.get(id); err == nil {
			t.Fatalf("task %d is still there", id)
		}
	}
	for _, id := range kept {
		if r := f.mustGet(id); r.Task.Status != task.Succeeded {
			t.Errorf("kept task %d is %s, want succeeded and kept", id, r.Task.Status)
		}
	}
	bs := f.mustBuckets()
	if !allHeldBy(bs, low, "survivor") {
		t.Errorf("the dead node's buckets are not the survivor's: %s", describeHolders(bs))
	}

	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var orphanEvents, orphanCommands, tasks int
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM flotilla_task_events e WHERE NOT EXISTS (SELECT 1 FROM flotilla_tasks t WHERE t.id = e.task_id)),
		(SELECT count(*) FROM flotilla_commands c WHERE NOT EXISTS (SELECT 1 FROM flotilla_tasks t WHERE t.id = c.task_id)),
		(SELECT count(*) FROM flotilla_tasks)`).Scan(&orphanEvents, &orphanCommands, &tasks); err != nil {
		t.Fatal(err)
	}
	if orphanEvents != 0 || orphanCommands != 0 || tasks != len(kept) {
		t.Errorf("%d events and %d commands of pruned tasks left, %d tasks; want 0, 0 and the %d kept",
			orphanEvents, orphanCommands, tasks, len(kept))
	}
}
