package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// deadIncarnation is a holder that took buckets 0-31, claimed a task, and
// died: nothing renews its leases any more.
const deadIncarnation = "dead/0badc0de"

// runningOnADeadHolder has deadIncarnation hold buckets 0-31 and claim a
// new task of kind work in one of them, with a task lease that outlasts the
// test; it returns the running task.
func (b *testBundle) runningOnADeadHolder(t *testing.T, maxAttempts int) *task.Task {
	t.Helper()
	leases, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{
		Owner: deadIncarnation, Node: "dead", Buckets: bucket.Of(span(0, 31)...), TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := b.keysIn(bucket.Of(span(0, 31)...), 1)[0]
	bk := b.policy.Of(key)
	if _, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "work", Key: key, Bucket: bk, MaxAttempts: maxAttempts}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{
		Owner: deadIncarnation, Node: "dead", Buckets: []store.HeldBucket{{Bucket: bk, Epoch: leases[bk].Epoch}},
		Kinds: []string{"work"}, Limit: 1, LeaseTTL: time.Hour,
	})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("the dead holder's claim: %v %+v", err, claimed)
	}
	return claimed[0]
}

// takeOver expires the dead holder's bucket leases and has the standby
// renew at once instead of at its next heartbeat.
func (b *testBundle) takeOver(t *testing.T, standby *Node) {
	t.Helper()
	for bk := 0; bk < 32; bk++ {
		if err := b.store.ExpireBucketLease(bk); err != nil {
			t.Fatal(err)
		}
	}
	standby.leaseLoop.poke()
}

// observed tees a config's logger into an observer, to check log fields.
func observed(cfg Config) (Config, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), core))
	return cfg, logs
}

// A standby that takes over from a dead holder rescues the task the dead
// holder was running at once, without waiting out its task lease (an hour
// here) or the reconcile interval (an hour too), and runs it again.
func TestATakeoverRescuesTheDeadHoldersTaskAndRunsItAgain(t *testing.T) {
	b := setup(t)
	running := b.runningOnADeadHolder(t, 3)

	attempts := make(chan int, 2)
	cfg := quickRetries(b.config(t, "standby", span(0, 31)...))
	cfg.ReconcileInterval = time.Hour
	cfg, logs := observed(cfg)
	standby := b.startNode(t, cfg, map[string]Handler{
		"work": func(_ context.Context, tk *task.Task) error { attempts <- tk.Attempt; return nil },
	})
	if held := standby.Held(); len(held) != 0 {
		t.Fatalf("the standby holds %v while the dead holder's leases run", held)
	}

	b.takeOver(t, standby)
	eventually(t, "the task succeeded", b.statusIs(t, running.ID, task.Succeeded))

	if got := receive(t, attempts, "the handler's run"); got != 2 {
		t.Errorf("the standby's handler ran attempt %d, want 2", got)
	}
	got := b.get(t, running.ID)
	newEpoch := running.Epoch + 1
	if got.Node != "standby" || got.Attempt != 2 || got.Epoch != newEpoch {
		t.Errorf("succeeded on %q at attempt %d under epoch %d, want standby, 2, %d", got.Node, got.Attempt, got.Epoch, newEpoch)
	}
	if trail := b.trail(t, running.ID); trail != "queued running retrying running succeeded" {
		t.Errorf("trail %q", trail)
	}
	events, err := b.store.TaskEvents(b.ctx, running.ID)
	if err != nil {
		t.Fatal(err)
	}
	rescue := events[2]
	if rescue.Node != "standby" || rescue.Epoch != newEpoch || !strings.Contains(rescue.Reason, deadIncarnation) {
		t.Errorf("rescue event %+v, want it by standby under epoch %d, naming %s", rescue, newEpoch, deadIncarnation)
	}

	entries := logs.FilterMessageSnippet("rescued a lost attempt").AllUntimed()
	if len(entries) != 1 {
		t.Fatalf("%d rescue log lines, want 1: %+v", len(entries), entries)
	}
	fields := entries[0].ContextMap()
	want := map[string]any{
		"node": "standby", "bucket": int64(running.Bucket), "epoch": newEpoch, "task": running.ID,
		"from": "running", "to": "retrying", "previous_owner": deadIncarnation,
	}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("rescue log field %s = %v (%T), want %v", k, fields[k], fields[k], v)
		}
	}
	if entries[0].Level != zapcore.InfoLevel {
		t.Errorf("rescue logged at %v, want info", entries[0].Level)
	}
}

// With no attempt left, the dead holder's task ends lost and never runs
// again.
func TestATakeoverLosesTheDeadHoldersTaskOnItsLastAttempt(t *testing.T) {
	b := setup(t)
	running := b.runningOnADeadHolder(t, 1)
	ran := make(chan int, 1)
	cfg := quickRetries(b.config(t, "standby", span(0, 31)...))
	cfg.ReconcileInterval = time.Hour
	standby := b.startNode(t, cfg, map[string]Handler{
		"work": func(_ context.Context, tk *task.Task) error { ran <- tk.Attempt; return nil },
	})

	b.takeOver(t, standby)
	eventually(t, "the task is lost", b.statusIs(t, running.ID, task.Lost))
	claimPassesAfter(t, standby)
	select {
	case attempt := <-ran:
		t.Errorf("a lost task ran again (attempt %d)", attempt)
	default:
	}
	if trail := b.trail(t, running.ID); trail != "queued running lost" {
		t.Errorf("trail %q", trail)
	}
}

// A task lease that runs out while its bucket's holder stays (its renewals
// failed, the process froze) is found by the rescue loop's periodic pass;
// the holder's own late outcome for the rescued attempt is fenced.
func TestTheRescueLoopFindsAnExpiredTaskLeaseEveryInterval(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.config(t, "solo")
	cfg.ReconcileInterval = time.Minute
	cfg.TaskLeaseTTL = 24 * time.Hour // no renewal during the test
	cfg.BackoffBase, cfg.BackoffMax = time.Second, time.Second
	started := make(chan int, 2)
	release := make(chan struct{})
	n := b.startNode(t, cfg, map[string]Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			started <- tk.Attempt
			if tk.Attempt == 1 {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		},
	})
	// The pass that Start's acquisition asked for has looked, and found
	// nothing: from here only the interval wakes the loop.
	eventually(t, "the pass at start", func() bool { return n.rescuer.passes.Load() >= 1 })
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k", MaxAttempts: 3})
	if got := receive(t, started, "attempt 1"); got != 1 {
		t.Fatalf("attempt %d started, want 1", got)
	}
	if err := b.store.ExpireTaskLease(tk.ID); err != nil {
		t.Fatal(err)
	}
	expiredAt := b.manual.Now()

	b.advanceUntil(t, "attempt 1 was rescued and attempt 2 succeeded", 10*time.Second, b.statusIs(t, tk.ID, task.Succeeded))
	if got := receive(t, started, "attempt 2"); got != 2 {
		t.Errorf("attempt %d started after the rescue, want 2", got)
	}
	close(release) // attempt 1 finishes late; its success must not be recorded
	eventually(t, "the late attempt is settled", func() bool {
		registered, _, _ := n.attempts.counts()
		return registered == 0
	})
	if trail := b.trail(t, tk.ID); trail != "queued running retrying running succeeded" {
		t.Fatalf("trail %q", trail)
	}
	events, err := b.store.TaskEvents(b.ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The rescue came one interval after the pass at start, in the
	// store's (manual) time.
	if after := events[2].At.Sub(expiredAt); after < cfg.ReconcileInterval {
		t.Errorf("rescued %v after the lease expired, before the interval of %v passed", after, cfg.ReconcileInterval)
	}
	if got := b.get(t, tk.ID); got.Attempt != 2 {
		t.Errorf("succeeded at attempt %d, want 2", got.Attempt)
	}
}

func TestReconcileIntervalDefaultsToTheTaskLeaseTTL(t *testing.T) {
	s := memory.New()
	defer s.Close()
	n, err := New(s, Config{AllBuckets: true, TaskLeaseTTL: 9 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.cfg.ReconcileInterval; got != 9*time.Second {
		t.Errorf("ReconcileInterval %v, want the task lease TTL, 9s", got)
	}
	_, err = New(s, Config{AllBuckets: true, ReconcileInterval: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "ReconcileInterval") {
		t.Errorf("a negative ReconcileInterval: %v, want an error naming the field", err)
	}
}
