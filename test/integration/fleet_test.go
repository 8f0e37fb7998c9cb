package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestTwoWorkersRunEachBucketsTasks splits the fleet between two processes
// and checks that every task runs on the holder of its bucket, and only
// there (invariant 1), with tasks routed by the command line's own hashing.
func TestTwoWorkersRunEachBucketsTasks(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	takeFleetSlot(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	f.worker("run", "--buckets", "0-31", "--node-id", "a")
	f.worker("run", "--buckets", "32-63", "--node-id", "b")
	f.waitUntilHeld("a", low, startWithin)
	f.waitUntilHeld("b", high, startWithin)

	// What the operator sees of the split.
	stdout, stderr, code := f.cli("buckets", "--json")
	if code != 0 {
		t.Fatalf("worker buckets --json exited %d: %s", code, stderr)
	}
	var shown []struct {
		Bucket int    `json:"bucket"`
		Holder string `json:"holder"`
	}
	decodeJSON(t, "worker buckets --json", stdout, &shown)
	if len(shown) != fleetBuckets {
		t.Fatalf("worker buckets --json listed %d buckets, want %d", len(shown), fleetBuckets)
	}
	for _, b := range shown {
		if want := map[bool]string{true: "a", false: "b"}[low.Contains(b.Bucket)]; b.Holder != want {
			t.Errorf("worker buckets --json: bucket %d held by %q, want %q", b.Bucket, b.Holder, want)
		}
	}

	// Each submission is a process of its own, as from a shell script; a
	// few at a time keep the two cores busy without starving the workers.
	// Forty distinct keys land in both halves but for a chance of 2^-39.
	const tasks = 40
	ids := make([]int64, tasks)
	inParallel(tasks, 4, func(i int) {
		key := fmt.Sprintf("k-%d", i)
		r, err := runWorker(f.dsn, "submit", "--kind", "noop", "--key", key)
		switch {
		case err != nil:
			t.Error(err)
		case r.code != 0:
			t.Errorf("worker submit --key %s exited %d: %s", key, r.code, r.stderr)
		default:
			if _, err := fmt.Sscan(r.stdout, &ids[i]); err != nil {
				t.Errorf("worker submit --key %s printed %q, want a task id", key, r.stdout)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	var (
		all      []*task.Task
		statuses map[task.Status]int
		lastErr  error
	)
	done := poll(taskWithin, func() bool {
		all, lastErr = f.list(store.TaskFilter{Limit: 1000})
		statuses = map[task.Status]int{}
		for _, tk := range all {
			statuses[tk.Status]++
		}
		return lastErr == nil && statuses[task.Succeeded] == tasks
	})
	if !done {
		t.Fatalf("after %v, not all %d tasks succeeded: %v (last error: %v)", taskWithin, tasks, statuses, lastErr)
	}
	if len(all) != tasks {
		t.Fatalf("the fleet has %d tasks, want the %d submitted", len(all), tasks)
	}

	byID := map[int64]*task.Task{}
	for _, tk := range all {
		byID[tk.ID] = tk
	}
	ranOn := map[string]int{}
	for i, id := range ids {
		key := fmt.Sprintf("k-%d", i)
		tk := byID[id]
		if tk == nil {
			t.Errorf("task %d (key %s) is missing", id, key)
			continue
		}
		wantBucket := f.policy.Of(key)
		wantNode := map[bool]string{true: "a", false: "b"}[low.Contains(wantBucket)]
		if tk.Key != key || tk.Bucket != wantBucket {
			t.Errorf("task %d: key %q in bucket %d, want key %q in bucket %d", id, tk.Key, tk.Bucket, key, wantBucket)
		}
		if tk.Node != wantNode || tk.Attempt != 1 {
			t.Errorf("task %d (bucket %d): ran on %q in attempt %d, want once on %q, the bucket's holder",
				id, tk.Bucket, tk.Node, tk.Attempt, wantNode)
		}
		ranOn[tk.Node]++
	}
	t.Logf("tasks run per node: %v", ranOn)
	if ranOn["a"] == 0 || ranOn["b"] == 0 {
		t.Errorf("tasks run per node = %v: %d distinct keys should land in both halves", ranOn, tasks)
	}
}

// TestAStandbyTakesOverAfterKill9 kills a bucket holder without warning and
// checks that a standby that declares the same buckets takes them once the
// holder's leases expire, under new epochs, and serves them (DESIGN §6).
func TestAStandbyTakesOverAfterKill9(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low := mustSet(t, "0-31")
	ttl := leaseTTL(2 * time.Second)
	// Neither balances: a node that does not stands by for what a live node
	// holds (balanced nodes share instead: elastic_test.go).
	holder := f.worker("run", "--buckets", "0-31", "--node-id", "holder", "--bucket-lease-ttl", ttl.String(), "--no-balance")
	f.waitUntilHeld("holder", low, startWithin)
	f.worker("run", "--buckets", "0-31", "--node-id", "standby", "--bucket-lease-ttl", ttl.String(), "--no-balance")
	f.waitUntilStandingBy("standby", low)

	// An observation window, not a wait: over three of the holder's
	// heartbeats (TTL/3 each), the standby, which asks for the same
	// buckets every heartbeat, must get none of them, and the holder's
	// renewals must keep their epochs.
	before := epochs(f.mustBuckets(), low)
	for end := time.Now().Add(ttl); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		bs := f.mustBuckets()
		if !allHeldBy(bs, low, "holder") {
			t.Fatalf("while the holder lives, buckets 0-31 changed hands: %s", describeHolders(bs))
		}
		for b, e := range epochs(bs, low) {
			if e != before[b] {
				t.Fatalf("bucket %d: epoch went from %d to %d while its holder renewed it", b, before[b], e)
			}
		}
	}

	sleepKey := keyIn(t, f.policy, low, "sleep")
	sleeping := f.submit("--kind", "sleep", "--key", sleepKey, "--payload", `{"duration":"30s"}`)
	f.waitForTask(sleeping, "running on holder", func(tk *task.Task) bool {
		return tk.Status == task.Running && tk.Node == "holder"
	})

	killed := time.Now()
	holder.kill9()
	after := f.waitUntilHeld("standby", low, 30*time.Second)
	t.Logf("takeover after kill -9: %v (TTL %v, heartbeat %v)", time.Since(killed).Round(time.Millisecond), ttl, ttl/3)
	for b, e := range epochs(after, low) {
		if e <= before[b] {
			t.Errorf("bucket %d: epoch %d after the takeover, want it above the holder's %d", b, e, before[b])
		}
	}

	// The new holder serves the bucket, even the one whose task the dead
	// holder left running (the rescue of that task is rescue_test.go's).
	sleepBucket := f.policy.Of(sleepKey)
	noopKey := keyIn(t, f.policy, mustSet(t, fmt.Sprint(sleepBucket)), "noop")
	noop := f.submit("--kind", "noop", "--key", noopKey)
	done := f.waitForTask(noop, "succeeded", succeeded).Task
	if done.Node != "standby" || done.Epoch != epochs(after, low)[sleepBucket] {
		t.Errorf("task %d in bucket %d ran on %q under epoch %d, want standby under the new epoch %d",
			noop, sleepBucket, done.Node, done.Epoch, epochs(after, low)[sleepBucket])
	}
}

// TestSigtermReleasesBucketsForAStandby stops a holder gracefully: it
// releases its leases and announces it, so that a standby takes over long
// before the 15 s TTL would have let it (DESIGN §6).
func TestSigtermReleasesBucketsForAStandby(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low := mustSet(t, "0-31")
	holder := f.worker("run", "--buckets", "0-31", "--node-id", "holder", "--no-balance")
	before := epochs(f.waitUntilHeld("holder", low, startWithin), low)
	f.worker("run", "--buckets", "0-31", "--node-id", "standby", "--no-balance")
	f.waitUntilStandingBy("standby", low)
	// The standby registers before it listens; a release announced in
	// between would reach it only at its next heartbeat, and the time
	// measured would be that instead of the announced hand-over.
	f.waitUntilListeningForReleases(2)

	stopped := time.Now()
	holder.term()
	// Within 10 s: the NOTIFY should make it near-immediate, and even
	// without it the standby's next heartbeat (every 5 s) finds the
	// buckets released. Only an expiry would take the full 15 s.
	after := f.waitUntilHeld("standby", low, 10*time.Second)
	t.Logf("hand-over after SIGTERM: %v (TTL 15s, heartbeat 5s)", time.Since(stopped).Round(time.Millisecond))
	for b, e := range epochs(after, low) {
		if e <= before[b] {
			t.Errorf("bucket %d: epoch %d after the hand-over, want it above the holder's %d", b, e, before[b])
		}
	}

	if code := holder.wait(30 * time.Second); code != 0 {
		t.Errorf("holder exited %d after SIGTERM, want 0", code)
	}
	if n, ok := f.node("holder"); !ok || n.StoppedAt.IsZero() || n.Alive {
		t.Errorf("after a graceful stop, node holder is %+v, want it marked stopped", n)
	}
}

// TestASecondProcessWithALiveNodeIDIsRefused starts a second process under
// a node id that a live process uses: it must refuse to start, take no
// lease, and leave the first process's leases alone (DESIGN §6).
func TestASecondProcessWithALiveNodeIDIsRefused(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	first := f.worker("run", "--buckets", "0-31", "--node-id", "same")
	before := epochs(f.waitUntilHeld("same", low, startWithin), low)
	registered, _ := f.node("same")

	// The second declares other buckets, so that a lease it took before
	// refusing would show.
	_, stderr, code := f.cli("run", "--buckets", "32-63", "--node-id", "same")
	if code != 3 {
		t.Fatalf("a second `worker run --node-id same` exited %d, want 3; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, `"same"`) {
		t.Errorf("the refusal does not name the node id %q:\n%s", "same", stderr)
	}

	if first.exited() {
		t.Fatalf("the first process exited after the second was refused")
	}
	bs := f.mustBuckets()
	if !allHeldBy(bs, low, "same") || !allHeldBy(bs, high, "") {
		t.Errorf("after the refusal, holders are %s; want 0-31 same and 32-63 nobody", describeHolders(bs))
	}
	for b, e := range epochs(bs, low) {
		if e != before[b] {
			t.Errorf("bucket %d: epoch went from %d to %d, want the first process's lease untouched", b, before[b], e)
		}
	}
	if n, _ := f.node("same"); n.Incarnation != registered.Incarnation || !n.Alive {
		t.Errorf("node same is now incarnation %q (alive %v), want the first process's %q, alive",
			n.Incarnation, n.Alive, registered.Incarnation)
	}
}
