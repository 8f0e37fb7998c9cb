package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// quickRetries makes retries due almost at once and found within
// milliseconds, for tests about attempt counts rather than delays.
func quickRetries(cfg Config) Config {
	cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, time.Millisecond
	cfg.PollInterval = 5 * time.Millisecond
	return cfg
}

func TestAFlakyTaskSucceedsOnItsThirdAttempt(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, quickRetries(b.config(t, "flaky")), map[string]Handler{
		"flaky": func(_ context.Context, tk *task.Task) error {
			if tk.Attempt < 3 {
				return fmt.Errorf("attempt %d: upstream unavailable", tk.Attempt)
			}
			return nil
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "flaky", Key: "k", MaxAttempts: 3})
	eventually(t, "the task succeeded", b.statusIs(t, tk.ID, task.Succeeded))
	got := b.get(t, tk.ID)
	if got.Attempt != 3 {
		t.Errorf("succeeded at attempt %d, want 3", got.Attempt)
	}
	if trail := b.trail(t, tk.ID); trail != "queued running retrying running retrying running succeeded" {
		t.Errorf("trail %q", trail)
	}
}

func TestATaskThatAlwaysFailsEndsFailedAfterItsAttempts(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, quickRetries(b.config(t, "failing")), map[string]Handler{
		"fail": func(_ context.Context, tk *task.Task) error {
			return fmt.Errorf("attempt %d: bad input", tk.Attempt)
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "fail", Key: "k", MaxAttempts: 3})
	eventually(t, "the task failed", b.statusIs(t, tk.ID, task.Failed))
	got := b.get(t, tk.ID)
	if got.Attempt != 3 || got.Error != "attempt 3: bad input" {
		t.Errorf("failed at attempt %d with %q, want attempt 3 with its error", got.Attempt, got.Error)
	}
	if trail := b.trail(t, tk.ID); trail != "queued running retrying running retrying running failed" {
		t.Errorf("trail %q", trail)
	}
}

// TestAFailedAttemptKeepsItsResult: what a failing handler records of its
// attempt (the exec kind's output) is kept with the failure, and replaced by
// the next attempt's.
func TestAFailedAttemptKeepsItsResult(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, quickRetries(b.config(t, "output")), map[string]Handler{
		"out": func(_ context.Context, tk *task.Task) error {
			tk.Result = []byte(fmt.Sprintf(`{"stderr": "attempt %d: disk full"}`, tk.Attempt))
			return errors.New("exit status 1")
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "out", Key: "k", MaxAttempts: 2})
	eventually(t, "the task failed", b.statusIs(t, tk.ID, task.Failed))
	if got := b.get(t, tk.ID); string(got.Result) != `{"stderr": "attempt 2: disk full"}` {
		t.Errorf("the failed task's result is %s, want the last attempt's", got.Result)
	}
}

func TestAnErrorNotWorthRetryingFailsAtOnce(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, quickRetries(b.config(t, "refusing")), map[string]Handler{
		"refuse": func(context.Context, *task.Task) error {
			return task.NoRetry(errors.New("the payload names no customer"))
		},
	})
	tk := submit(t, n, SubmitRequest{Kind: "refuse", Key: "k", MaxAttempts: 5})
	eventually(t, "the task failed", b.statusIs(t, tk.ID, task.Failed))
	got := b.get(t, tk.ID)
	if got.Attempt != 1 || got.Error != "the payload names no customer" {
		t.Errorf("failed at attempt %d with %q, want attempt 1 with its error", got.Attempt, got.Error)
	}
	if trail := b.trail(t, tk.ID); trail != "queued running failed" {
		t.Errorf("trail %q, want no retry", trail)
	}
}

func TestAPanicIsAFailedAttemptWithItsStack(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, b.config(t, "panicky"), map[string]Handler{
		"panic": func(context.Context, *task.Task) error { panic("boom-4711") },
	})
	tk := submit(t, n, SubmitRequest{Kind: "panic", Key: "k", MaxAttempts: 1})
	eventually(t, "the task failed", b.statusIs(t, tk.ID, task.Failed))
	msg := b.get(t, tk.ID).Error
	for _, want := range []string{"panicked", "boom-4711", "goroutine"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
}

func TestATimeoutRetriesThenEndsTimedOut(t *testing.T) {
	b := setup(t, withManualClock())
	causes := make(chan error, 2)
	cfg := b.config(t, "slowpoke")
	cfg.BackoffBase, cfg.BackoffMax = time.Second, time.Second
	n := b.newNode(t, cfg, map[string]Handler{
		"slow": func(ctx context.Context, _ *task.Task) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	})
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	tk := submit(t, n, SubmitRequest{Kind: "slow", Key: "k", MaxAttempts: 2, Timeout: 5 * time.Second})
	b.advanceUntil(t, "the task timed out", time.Second, b.statusIs(t, tk.ID, task.TimedOut))

	if trail := b.trail(t, tk.ID); trail != "queued running retrying running timed_out" {
		t.Errorf("trail %q, want a retry after the first timeout and timed_out after the last", trail)
	}
	got := b.get(t, tk.ID)
	if got.Attempt != 2 || !strings.Contains(got.Error, "timed out after 5s") {
		t.Errorf("attempt %d, error %q", got.Attempt, got.Error)
	}
	for i := 0; i < 2; i++ {
		if cause := receive(t, causes, "the handler's cancellation"); !errors.Is(cause, ErrTimeout) {
			t.Errorf("handler cancelled with %v, want ErrTimeout", cause)
		}
	}
}

// Retry delays are database time: the task waits in retrying with run_at in
// the future, and is claimed once the store's clock passes it.
func TestRetriesWaitForTheirBackoffInStoreTime(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.config(t, "patient")
	cfg.BackoffBase, cfg.BackoffMax = 10*time.Second, 15*time.Second
	n := b.newNode(t, cfg, map[string]Handler{
		"fail": func(context.Context, *task.Task) error { return errors.New("not yet") },
	})
	n.jitter = func(c time.Duration) time.Duration { return c } // the ceiling, exactly
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	tk := submit(t, n, SubmitRequest{Kind: "fail", Key: "k", MaxAttempts: 3})

	failedAttempt := func(attempt int) func() bool {
		return func() bool {
			got := b.get(t, tk.ID)
			return got.Status == task.Retrying && got.Attempt == attempt
		}
	}
	checkDelay := func(attempt int, delay time.Duration) {
		t.Helper()
		events, err := b.store.TaskEvents(b.ctx, tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		failedAt := events[len(events)-1].At
		if got := b.get(t, tk.ID).RunAt.Sub(failedAt); got != delay {
			t.Fatalf("after attempt %d run_at is %v after the failure, want %v", attempt, got, delay)
		}
	}

	eventually(t, "attempt 1 failed", failedAttempt(1))
	checkDelay(1, 10*time.Second)
	b.manual.Advance(9 * time.Second)
	claimPassesAfter(t, n)
	if got := b.get(t, tk.ID); got.Status != task.Retrying || got.Attempt != 1 {
		t.Fatalf("claimed before its run_at: %s at attempt %d", got.Status, got.Attempt)
	}
	// From here the clock moves in small steps until the poll finds the
	// task due; the store refuses to hand it out any earlier.
	b.advanceUntil(t, "attempt 2 failed", 100*time.Millisecond, failedAttempt(2))
	checkDelay(2, 15*time.Second) // 20s, capped
	b.advanceUntil(t, "the last attempt failed", time.Second, b.statusIs(t, tk.ID, task.Failed))
	if got := b.get(t, tk.ID).Attempt; got != 3 {
		t.Errorf("failed at attempt %d, want 3", got)
	}
	if trail := b.trail(t, tk.ID); trail != "queued running retrying running retrying running failed" {
		t.Errorf("trail %q", trail)
	}
}

func TestBackoffStaysWithinItsBounds(t *testing.T) {
	const base, ceiling = time.Second, 10 * time.Minute
	top := func(c time.Duration) time.Duration { return c }
	for attempt, want := range map[int]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		10: 512 * time.Second, 11: ceiling, 64: ceiling, 1 << 30: ceiling,
	} {
		if got := backoff(attempt, base, ceiling, top); got != want {
			t.Errorf("ceiling of attempt %d = %v, want %v", attempt, got, want)
		}
	}
	// A jitter source that misbehaves is clamped into [0, ceiling].
	if got := backoff(3, base, ceiling, func(time.Duration) time.Duration { return time.Hour }); got != 4*time.Second {
		t.Errorf("over-long jitter gave %v", got)
	}
	if got := backoff(3, base, ceiling, func(time.Duration) time.Duration { return -time.Second }); got != 0 {
		t.Errorf("negative jitter gave %v", got)
	}
	// The node's own jitter: full range, never out of bounds.
	n := &Node{cfg: Config{BackoffBase: base, BackoffMax: ceiling}}
	n.jitter = defaultJitter
	for attempt := 1; attempt < 40; attempt++ {
		limit := backoff(attempt, base, ceiling, top)
		for i := 0; i < 50; i++ {
			if d := n.backoff(attempt); d < 0 || d > limit {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, limit)
			}
		}
	}
	// Near the largest duration, doubling must not overflow.
	if got := backoff(80, time.Duration(1<<61), time.Duration(1<<62+1), top); got != time.Duration(1<<62+1) {
		t.Errorf("huge ceiling gave %v", got)
	}
}
