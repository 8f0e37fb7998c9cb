package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// TestASecondSignalForcesTheExit: the first SIGTERM says how long shutdown
// waits for running handlers and how to force it; the second ends the wait
// at once, releasing every bucket in which no handler still runs, and
// leaving the bucket of the abandoned handler to lapse (its task is
// rescued after the lease expires, never while it may still run here).
func TestASecondSignalForcesTheExit(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	p := f.worker("run", "--node-id", "a", "--shutdown-timeout", "10m")
	all := mustSet(t, "0-63")
	f.waitUntilHeld("a", all, startWithin)
	id := f.submit("--kind", "sleep", "--key", "long", "--payload", `{"duration":"1h"}`)
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })
	taskBucket := f.policy.Of("long")

	p.term()
	eventually(t, startWithin, "the first signal is announced", func() bool {
		return strings.Contains(p.output(), "shutting down: waiting up to 10m0s for running handlers; press Ctrl-C again to force")
	})
	if p.exited() {
		t.Fatal("the node exited at the first signal, with a handler running and 10m to wait for it")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(startWithin)
	if !strings.Contains(p.output(), "forcing the exit") {
		t.Errorf("the second signal is not announced in the log")
	}
	// 0 when the cancelled handler returned in the moment the node looked,
	// 1 when it was abandoned; either way at once, not after 10m.
	if code != 0 && code != 1 {
		t.Errorf("a forced exit exited %d, want 0 or 1", code)
	}
	// Right after the exit, long before the 15s leases would expire: every
	// bucket but the abandoned task's was released.
	for _, b := range f.mustBuckets() {
		if b.Bucket != taskBucket && b.Holder != "" {
			t.Errorf("bucket %d is still held by %s after the forced exit: it had no handler running and should be released",
				b.Bucket, b.Holder)
		}
	}
}

// TestARestartWithTheSameNodeIDWaitsForTheOldIncarnation: right after a
// kill -9, a node started again with the same --node-id and
// --wait-for-node-id logs whom it waits on and until when, and starts once
// the old incarnation has expired, instead of exiting with status 3.
func TestARestartWithTheSameNodeIDWaitsForTheOldIncarnation(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	all := mustSet(t, "0-63")
	// Long enough that the old incarnation is still alive when the second
	// process, started after the kill, looks: or it would not wait.
	ttl := leaseTTL(5 * time.Second).String()
	first := f.worker("run", "--node-id", "same", "--bucket-lease-ttl", ttl)
	f.waitUntilHeld("same", all, startWithin)
	old, _ := f.node("same")
	first.kill9()

	second := f.worker("run", "--node-id", "same", "--bucket-lease-ttl", ttl, "--wait-for-node-id")
	eventually(t, startWithin, "the restarted node says whom it waits on", func() bool {
		out := second.output()
		return strings.Contains(out, "waiting for the node id's live incarnation to expire") &&
			strings.Contains(out, old.Incarnation) && strings.Contains(out, "until")
	})
	eventually(t, startWithin, "a new incarnation of node same is registered and alive", func() bool {
		n, _ := f.node("same")
		return n.Incarnation != old.Incarnation && n.Alive
	})
	f.waitUntilHeld("same", all, startWithin)
	if second.exited() {
		t.Errorf("the restarted node exited: %s", second.output())
	}
}

// TestTheSleepKindPausesAndResumes: the README's tour pauses a running
// sleep task; it stops at its next checkpoint with how long it slept saved,
// and after a resume sleeps only the rest.
func TestTheSleepKindPausesAndResumes(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	f.worker("run", "--node-id", "a")
	f.waitUntilHeld("a", mustSet(t, "0-63"), startWithin)
	id := f.submit("--kind", "sleep", "--key", "order-16", "--payload", `{"duration":"1h"}`)
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })
	if _, stderr, code := f.cli("pause", fmt.Sprint(id)); code != 0 {
		t.Fatalf("pause: exit %d: %s", code, stderr)
	}
	r := f.waitForTask(id, "paused", func(tk *task.Task) bool { return tk.Status == task.Paused })
	var progress struct {
		Slept string `json:"slept"`
	}
	if err := json.Unmarshal(r.Task.Progress, &progress); err != nil || progress.Slept == "" {
		t.Fatalf("paused sleep saved progress %s (%v), want how long it slept", r.Task.Progress, err)
	}
	stdout, _, code := f.cli("get", fmt.Sprint(id))
	if code != 0 || !strings.Contains(stdout, "paused: `worker resume` queues it again") {
		t.Errorf("get of a paused task does not say why it waits:\n%s", stdout)
	}
	if _, stderr, code := f.cli("resume", fmt.Sprint(id)); code != 0 {
		t.Fatalf("resume: exit %d: %s", code, stderr)
	}
	f.waitForTask(id, "running again", func(tk *task.Task) bool { return tk.Status == task.Running && tk.Attempt == 2 })
}
