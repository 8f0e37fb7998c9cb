package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// TestWorkerReconcileRescuesOnlyUnheldBuckets: a node dies with a task
// running and nobody stands by for its buckets. `worker reconcile
// --dry-run` reports the rescue and changes nothing; `worker reconcile`
// rescues the task (retrying, attempt kept) under a lease it takes and
// gives back, and leaves the buckets a live node holds to that node.
func TestWorkerReconcileRescuesOnlyUnheldBuckets(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	holder := f.worker("run", "--buckets", "0-31", "--node-id", "doomed", "--bucket-lease-ttl", leaseTTL(2*time.Second).String())
	f.worker("run", "--buckets", "32-63", "--node-id", "alive")
	f.waitUntilHeld("doomed", low, startWithin)
	f.waitUntilHeld("alive", high, startWithin)

	id := f.submit("--kind", "sleep", "--key", keyIn(t, f.policy, low, "orphan"), "--payload", `{"duration":"60s"}`)
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })
	holder.kill9()
	eventually(t, 30*time.Second, "the dead node's leases expire", func() bool {
		bs, err := f.buckets()
		if err != nil {
			return false
		}
		for _, b := range bs {
			if low.Contains(b.Bucket) && b.Holder != "" {
				return false
			}
		}
		return true
	})

	type report struct {
		DryRun  bool   `json:"dry_run"`
		Buckets string `json:"buckets"`
		Rescued []struct {
			Task    int64  `json:"task"`
			Outcome string `json:"outcome"`
			To      string `json:"to"`
			Owner   string `json:"previous_owner"`
		} `json:"rescued"`
		Skipped []struct {
			Bucket int    `json:"bucket"`
			Holder string `json:"holder"`
		} `json:"skipped"`
	}
	run := func(args ...string) report {
		t.Helper()
		stdout, stderr, code := f.cli(append([]string{"reconcile", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("worker reconcile %s exited %d: %s", strings.Join(args, " "), code, stderr)
		}
		var r report
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("worker reconcile printed %q: %v", stdout, err)
		}
		return r
	}

	dry := run("--dry-run")
	if !dry.DryRun || dry.Buckets != "0-31" || len(dry.Rescued) != 1 || dry.Rescued[0].Task != id ||
		dry.Rescued[0].Outcome != "retried" || !strings.HasPrefix(dry.Rescued[0].Owner, "doomed/") {
		t.Fatalf("dry run: %+v, want task %d to be retried, in buckets 0-31 only", dry, id)
	}
	if len(dry.Skipped) != 32 || dry.Skipped[0].Bucket != 32 || dry.Skipped[0].Holder != "alive" {
		t.Errorf("dry run skipped %+v, want 32-63 held by alive", dry.Skipped)
	}
	if got := f.mustGet(id).Task.Status; got != task.Running {
		t.Fatalf("a dry run moved the task to %s", got)
	}

	done := run("--buckets", "0-40")
	if done.DryRun || len(done.Rescued) != 1 || done.Rescued[0].To != string(task.Retrying) {
		t.Fatalf("real run: %+v, want task %d retrying", done, id)
	}
	if len(done.Skipped) != 9 {
		t.Errorf("real run over 0-40 skipped %d buckets, want 32-40 (9)", len(done.Skipped))
	}
	r := f.mustGet(id)
	if r.Task.Status != task.Retrying || r.Task.Attempt != 1 {
		t.Errorf("after worker reconcile: %s", describeTask(r))
	}
	last := r.Events[len(r.Events)-1]
	if !strings.Contains(last.Reason, "doomed/") || !strings.HasPrefix(last.Node, "reconcile-") {
		t.Errorf("rescue event %+v, want it by the reconcile run, naming the dead owner", last)
	}
	for _, b := range f.mustBuckets() {
		if low.Contains(b.Bucket) && b.Holder != "" {
			t.Errorf("bucket %d still held by %q after the run; it should give its leases back", b.Bucket, b.Holder)
		}
	}
}
