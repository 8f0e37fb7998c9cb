package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// pruneFleet is a fleet with a cancelled task two days old in each of
// buckets 0, 1 and 2, and a fresh one in bucket 0; a live node holds
// bucket 1. It answers the DSN and the old tasks' ids by bucket.
func pruneFleet(t *testing.T) (string, map[int]int64, *postgres.Store) {
	t.Helper()
	withoutDSNEnv(t)
	dsn := testdb.New(t)
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	ctx := context.Background()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "live/1", Node: "live",
		Buckets: bucket.Of(1), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	old := map[int]int64{}
	for _, b := range []int{0, 1, 2, 0} {
		tks, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: b}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Transition(ctx, store.Transition{ID: tks[0].ID, Version: 1, To: task.Cancelled}); err != nil {
			t.Fatal(err)
		}
		if _, seen := old[b]; seen {
			continue // the second task of bucket 0 stays fresh
		}
		old[b] = tks[0].ID
		if _, err := s.Pool().Exec(ctx, `UPDATE flotilla_tasks SET finished_at = finished_at - interval '48 hours'
			WHERE id = $1`, tks[0].ID); err != nil {
			t.Fatal(err)
		}
	}
	return dsn, old, s
}

func taskCount(t *testing.T, s *postgres.Store) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM flotilla_tasks`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPruneDryRunCountsAndRemovesNothing(t *testing.T) {
	dsn, _, s := pruneFleet(t)
	stdout, stderr, code := runWorker(t, "prune", "--dsn", dsn, "--dry-run", "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got struct {
		DryRun  bool          `json:"dry_run"`
		Tasks   int           `json:"tasks"`
		Pruned  []prunedJSON  `json:"pruned"`
		Skipped []skippedJSON `json:"skipped"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if !got.DryRun || got.Tasks != 2 || len(got.Pruned) != 2 || got.Pruned[0].Bucket != 0 || got.Pruned[1].Bucket != 2 ||
		got.Pruned[0].Status != "cancelled" || got.Pruned[0].Oldest == "" {
		t.Errorf("dry run: %s", stdout)
	}
	if len(got.Skipped) != 1 || got.Skipped[0].Bucket != 1 || got.Skipped[0].Holder != "live" {
		t.Errorf("dry run skipped %+v, want bucket 1 held by live", got.Skipped)
	}
	if n := taskCount(t, s); n != 4 {
		t.Errorf("%d tasks after a dry run, want all 4", n)
	}
	stdout, _, code = runWorker(t, "prune", "--dsn", dsn, "--dry-run")
	if code != exitOK || !strings.Contains(stdout, "would prune 2 tasks") || !strings.Contains(stdout, "cancelled") {
		t.Errorf("dry run table: exit %d\n%s", code, stdout)
	}
}

func TestPruneRemovesOldTasksOfUnheldBucketsOnly(t *testing.T) {
	dsn, old, s := pruneFleet(t)
	stdout, stderr, code := runWorker(t, "prune", "--dsn", dsn, "--buckets", "0-1", "--batch", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"skipped 1 buckets held by live nodes", "pruned 1 tasks"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("prune does not say %q:\n%s", want, stdout)
		}
	}
	ctx := context.Background()
	if _, err := s.GetTask(ctx, old[0]); err == nil {
		t.Error("the old task of bucket 0 was not pruned")
	}
	for _, b := range []int{1, 2} {
		if _, err := s.GetTask(ctx, old[b]); err != nil {
			t.Errorf("the old task of bucket %d (held, or not asked for): %v", b, err)
		}
	}
	if n := taskCount(t, s); n != 3 {
		t.Errorf("%d tasks left, want 3", n)
	}
	leases, err := s.ListBuckets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if leases[0].Holder != "" || leases[0].Epoch != 1 || leases[1].Node != "live" {
		t.Errorf("after the run: bucket 0 held by %q at epoch %d, bucket 1 by %q; want 0 released at epoch 1, 1 still live's",
			leases[0].Holder, leases[0].Epoch, leases[1].Node)
	}
	// Keeping cancelled tasks forever prunes nothing.
	stdout, _, code = runWorker(t, "prune", "--dsn", dsn, "--retain", "cancelled=0")
	if code != exitOK || !strings.Contains(stdout, "pruned 0 tasks") {
		t.Errorf("prune with cancelled=0: exit %d\n%s", code, stdout)
	}
}

func TestParseRetentionFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		check func(store.Retention) bool
	}{
		{nil, func(r store.Retention) bool {
			return r.Age("x", task.Succeeded) == 24*time.Hour && r.Age("x", task.Lost) == 168*time.Hour
		}},
		{[]string{"--retain", "succeeded=1h"}, func(r store.Retention) bool {
			return r.Age("x", task.Succeeded) == time.Hour && r.Age("x", task.Failed) == 168*time.Hour
		}},
		{[]string{"--retain", "all=0,failed=720h"}, func(r store.Retention) bool {
			return r.Age("x", task.Succeeded) == 0 && r.Age("x", task.Failed) == 720*time.Hour
		}},
		{[]string{"--retain-kind", "email:succeeded=1m,failed=2h", "--retain-kind", "audit:all=0"}, func(r store.Retention) bool {
			return r.Age("email", task.Succeeded) == time.Minute && r.Age("email", task.Failed) == 2*time.Hour &&
				r.Age("email", task.Lost) == 168*time.Hour && r.Age("audit", task.Succeeded) == 0 &&
				r.Age("other", task.Succeeded) == 24*time.Hour
		}},
	} {
		app := newApp(&strings.Builder{}, &strings.Builder{})
		var got store.Retention
		var perr error
		for _, c := range app.Commands {
			if c.Name == "prune" {
				c.Action = func(c *cli.Context) error { got, perr = parseRetention(c); return nil }
			}
		}
		if err := app.Run(append([]string{"worker", "prune"}, tc.args...)); err != nil || perr != nil {
			t.Fatalf("%v: %v, %v", tc.args, err, perr)
		}
		if !tc.check(got) {
			t.Errorf("%v: %+v", tc.args, got)
		}
	}
}
