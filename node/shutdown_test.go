package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

func TestShutdownFinishesWhatItCanAndReleasesTheRest(t *testing.T) {
	b := setup(t, withManualClock())
	finish := make(chan struct{})
	slowCause := make(chan error, 1)
	cfg := b.config(t, "leaver")
	cfg.ShutdownTimeout = 30 * time.Second
	n := b.startNode(t, cfg, map[string]Handler{
		"quick": func(ctx context.Context, _ *task.Task) error {
			<-finish
			return nil
		},
		"stubborn": func(ctx context.Context, _ *task.Task) error {
			<-ctx.Done()
			slowCause <- context.Cause(ctx)
			return ctx.Err()
		},
	})
	quick := submit(t, n, SubmitRequest{Kind: "quick", Key: "a"})
	stubborn := submit(t, n, SubmitRequest{Kind: "stubborn", Key: "b"})
	eventually(t, "both handlers running", func() bool { return n.activeHandlers() == 2 })

	done := make(chan error, 1)
	go func() { done <- n.Shutdown(context.Background()) }()
	eventually(t, "the shutdown began", func() bool {
		return n.isDraining()
	})
	// The quick handler finishes within the timeout, and its outcome is
	// written while the node drains.
	close(finish)
	eventually(t, "the quick task succeeded", b.statusIs(t, quick.ID, task.Succeeded))
	if got := b.get(t, stubborn.ID).Status; got != task.Running {
		t.Fatalf("the stubborn task is %s before the shutdown timeout", got)
	}

	var err error
	b.advanceUntil(t, "Shutdown returned", 5*time.Second, func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if cause := receive(t, slowCause, "the handler's cancellation"); !errors.Is(cause, ErrShuttingDown) {
		t.Errorf("stubborn handler cancelled with %v, want ErrShuttingDown", cause)
	}

	got := b.get(t, stubborn.ID)
	if got.Status != task.Queued || got.Attempt != 0 || got.ClaimSeq != 1 || got.Owner != "" {
		t.Errorf("released task: status %s attempt %d claim_seq %d owner %q; want queued, the attempt not counted",
			got.Status, got.Attempt, got.ClaimSeq, got.Owner)
	}
	events, _ := b.store.TaskEvents(b.ctx, stubborn.ID)
	if last := events[len(events)-1]; last.From != task.Running || last.Reason != "released at shutdown" {
		t.Errorf("last event %+v, want running -> queued released at shutdown", last)
	}

	leases, _ := b.store.ListBuckets(b.ctx)
	for _, l := range leases {
		if l.Holder != "" {
			t.Errorf("bucket %d still held by %q after shutdown", l.Bucket, l.Holder)
		}
	}
	nodes, _ := b.store.ListNodes(b.ctx)
	if len(nodes) != 1 || nodes[0].Alive || nodes[0].StoppedAt.IsZero() {
		t.Errorf("nodes after shutdown: %+v, want the node marked stopped", nodes)
	}
	if held := n.Held(); len(held) != 0 {
		t.Errorf("Held after shutdown: %v", held)
	}
}

func TestAStandbyTakesOverAtOnceAfterAGracefulShutdown(t *testing.T) {
	b := setup(t)
	leaving := b.startNode(t, b.config(t, "leaving", span(0, 31)...), map[string]Handler{"work": noop})
	cfg := b.config(t, "standby", span(0, 31)...)
	cfg.BucketLeaseTTL = time.Hour // its next lease tick is 20 minutes away
	standby := b.startNode(t, cfg, map[string]Handler{"work": noop})
	if len(standby.Held()) != 0 {
		t.Fatal("the standby holds buckets while the first node lives")
	}
	if err := leaving.Shutdown(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The release is announced: the standby's lease loop wakes on it.
	eventually(t, "the standby took the released buckets", func() bool { return len(standby.Held()) == 32 })
}

func TestLifecycleCallsAreSafeInAnyOrder(t *testing.T) {
	b := setup(t)
	never := b.newNode(t, b.config(t, "never"), nil)
	if err := never.Shutdown(b.ctx); err != nil {
		t.Errorf("Shutdown without Start: %v", err)
	}
	if err := never.Start(b.ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("Start after Shutdown: %v, want ErrStopped", err)
	}
	if _, err := never.Submit(b.ctx, SubmitRequest{Kind: "work", Key: "k"}); !errors.Is(err, ErrStopped) {
		t.Errorf("Submit after Shutdown: %v, want ErrStopped", err)
	}

	n := b.startNode(t, b.config(t, "twice"), map[string]Handler{"work": noop})
	if err := n.Start(b.ctx); err == nil {
		t.Error("a second Start succeeded")
	}
	if err := n.Shutdown(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(b.ctx); err != nil {
		t.Errorf("a second Shutdown: %v", err)
	}
}

func TestRegisterRefusesMistakes(t *testing.T) {
	b := setup(t)
	n := b.newNode(t, b.config(t, "registrar"), map[string]Handler{"work": noop})
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", what)
			}
		}()
		f()
	}
	mustPanic("an empty kind", func() { n.Register("", noop) })
	mustPanic("a nil handler", func() { n.Register("x", nil) })
	mustPanic("a duplicate kind", func() { n.Register("work", noop) })
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	mustPanic("a kind after Start", func() { n.Register("late", noop) })
}

func TestTheInlineExecutorRunsTasksInTheClaimLoop(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "inline")
	cfg.Executor = InlineExecutor{}
	cfg.Concurrency = 4
	n := b.startNode(t, cfg, map[string]Handler{"work": noop})
	reqs := make([]SubmitRequest, 20)
	for i := range reqs {
		reqs[i] = SubmitRequest{Kind: "work"}
	}
	if _, err := n.SubmitMany(b.ctx, reqs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "all succeeded", func() bool { return b.countByStatus(t)[task.Succeeded] == len(reqs) })
}
