package reconcile

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The decision for each kind of expired task, and the one audit event each
// rescue writes. The owner rescues its own task here: its task lease ran out
// while it kept its bucket (its renewals failed, or its handler hung).
func TestAnExpiredTaskIsRetriedLostOrStopped(t *testing.T) {
	cases := []struct {
		name        string
		maxAttempts int
		prepare     func(t *testing.T, b *testBundle, owner string, tk *task.Task)
		want        task.Status
		outcome     Outcome
	}{
		{name: "running with attempts left", maxAttempts: 3, want: task.Retrying, outcome: OutcomeRetried},
		{name: "running on its last attempt", maxAttempts: 1, want: task.Lost, outcome: OutcomeLost},
		{name: "running with a stop pending", maxAttempts: 3, prepare: issueStop,
			want: task.Stopped, outcome: OutcomeStopped},
		{name: "a stop pending on the last attempt", maxAttempts: 1, prepare: issueStop,
			want: task.Stopped, outcome: OutcomeStopped},
		{name: "stopping", maxAttempts: 3, prepare: moveTo(task.Stopping),
			want: task.Stopped, outcome: OutcomeStopped},
		// A pending pause wins over the retry: the operator asked for the
		// task to wait, and it waits, with the progress it saved.
		{name: "pausing with attempts left", maxAttempts: 3, prepare: moveTo(task.Pausing),
			want: task.Paused, outcome: OutcomePaused},
		{name: "running with a pause pending", maxAttempts: 3, prepare: issuePause,
			want: task.Paused, outcome: OutcomePaused},
		{name: "pausing on its last attempt", maxAttempts: 1, prepare: moveTo(task.Pausing),
			want: task.Lost, outcome: OutcomeLost},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := setup(t)
			const owner = "node-a/1a2b"
			held := b.hold(t, owner, 3)
			tk := b.running(t, owner, held, 3, c.maxAttempts)
			if c.prepare != nil {
				c.prepare(t, b, owner, tk)
			}
			b.expire(t, tk)
			before := b.get(t, tk.ID)
			eventsBefore := len(b.events(t, tk.ID))

			rep := b.rescue(t, b.store, owner, held)

			e := entryFor(t, rep, tk.ID)
			if e.Outcome != c.outcome || e.From != before.Status || e.To != c.want || e.Err != "" {
				t.Errorf("entry %+v, want %s from %s to %s", e, c.outcome, before.Status, c.want)
			}
			if e.PreviousOwner != owner || e.Attempt != 1 || e.Bucket != 3 || e.Kind != "work" || e.Epoch != held[0].Epoch {
				t.Errorf("entry %+v does not describe attempt 1 of %s in bucket 3 under epoch %d", e, owner, held[0].Epoch)
			}
			got := b.get(t, tk.ID)
			if got.Status != c.want || got.Attempt != 1 || got.Owner != "" {
				t.Errorf("task is %s at attempt %d owned by %q, want %s at attempt 1, no owner",
					got.Status, got.Attempt, got.Owner, c.want)
			}

			events := b.events(t, tk.ID)
			if len(events) != eventsBefore+1 {
				t.Fatalf("the rescue wrote %d events, want 1", len(events)-eventsBefore)
			}
			ev := events[len(events)-1]
			if ev.From != before.Status || ev.To != c.want || ev.Node != "node-a" || ev.Epoch != held[0].Epoch || ev.Attempt != 1 {
				t.Errorf("audit event %+v, want %s -> %s by node-a under epoch %d, attempt 1",
					ev, before.Status, c.want, held[0].Epoch)
			}
			if want := "lease of " + owner + " expired"; ev.Reason != want || e.Reason != want {
				t.Errorf("reason %q (report %q), want %q", ev.Reason, e.Reason, want)
			}
			if !strings.Contains(got.Error, "attempt 1") || !strings.Contains(got.Error, owner) {
				t.Errorf("task error %q does not say which attempt of whom was lost", got.Error)
			}

			if c.want == task.Retrying {
				// The attempt is kept (the claim counts the next one), and
				// the retry waits for the backoff of attempt 1, in
				// database time.
				if e.Delay != testBackoff(1) || !got.RunAt.Equal(ev.At.Add(testBackoff(1))) {
					t.Errorf("delay %v and run_at %v, want %v after the rescue at %v",
						e.Delay, got.RunAt, testBackoff(1), ev.At)
				}
			} else if e.Delay != 0 {
				t.Errorf("delay %v for a task that is not retried", e.Delay)
			}
		})
	}
}

func issuePause(t *testing.T, b *testBundle, _ string, tk *task.Task) {
	t.Helper()
	if _, err := b.store.IssueCommand(b.ctx, store.NewCommand{
		TaskID: tk.ID, Kind: store.CommandPause, Reason: "operator", IssuedBy: "test",
	}); err != nil {
		t.Fatal(err)
	}
}

func issueStop(t *testing.T, b *testBundle, _ string, tk *task.Task) {
	t.Helper()
	if _, err := b.store.IssueCommand(b.ctx, store.NewCommand{
		TaskID: tk.ID, Kind: store.CommandStop, Reason: "operator", IssuedBy: "test",
	}); err != nil {
		t.Fatal(err)
	}
}

func moveTo(status task.Status) func(*testing.T, *testBundle, string, *task.Task) {
	return func(t *testing.T, b *testBundle, owner string, tk *task.Task) {
		t.Helper()
		out, err := b.store.AdvanceActive(b.ctx, owner, []store.ActiveTransition{{Ref: tk.Ref(), To: status, Node: nodeOf(owner)}})
		if err != nil || out[0].Err != nil || out[0].Status != status {
			t.Fatalf("moving task %d to %s: %v %+v", tk.ID, status, err, out)
		}
	}
}

// Expiry is by the database clock: a task lease is live until the store's
// now passes it, and then it is rescued without any hook.
func TestALiveTaskLeaseIsLeftAlone(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	tk := b.running(t, owner, held, 0, 3)

	b.clock.Advance(taskTTL - time.Second)
	if rep := b.rescue(t, b.store, owner, held); len(rep.Entries) != 0 || rep.Passes != 1 {
		t.Fatalf("a live task lease was rescued: %+v", rep)
	}
	b.unchanged(t, tk)

	b.clock.Advance(time.Second)
	rep := b.rescue(t, b.store, owner, held)
	if rep.Retried != 1 || b.get(t, tk.ID).Status != task.Retrying {
		t.Fatalf("once the database clock reached its lease's end, the task was not rescued: %+v", rep)
	}
}

// DESIGN §6: after a takeover the new holder rescues the tasks claimed
// under the older epoch at once, although their task leases still run;
// and the old attempt's late completion is fenced (invariant 2).
func TestAfterATakeoverTheOldEpochsTasksAreRescuedAtOnce(t *testing.T) {
	b := setup(t)
	const dead, successor = "node-a/dead", "node-b/2c3d"
	oldHeld := b.hold(t, dead, 2)
	tk := b.running(t, dead, oldHeld, 2, 3)

	if err := b.store.ExpireBucketLease(2); err != nil {
		t.Fatal(err)
	}
	held := b.hold(t, successor, 2)
	if held[0].Epoch != oldHeld[0].Epoch+1 {
		t.Fatalf("takeover at epoch %d, want %d", held[0].Epoch, oldHeld[0].Epoch+1)
	}
	if now := b.clock.Now(); !b.get(t, tk.ID).LeaseExpiresAt.After(now) {
		t.Fatal("the test needs the dead owner's task lease to be live still")
	}

	rep := b.rescue(t, b.store, successor, held)
	e := entryFor(t, rep, tk.ID)
	if e.Outcome != OutcomeRetried || e.PreviousOwner != dead || e.PreviousEpoch != oldHeld[0].Epoch || e.Epoch != held[0].Epoch {
		t.Fatalf("entry %+v, want a retry of %s's attempt from epoch %d under epoch %d",
			e, dead, oldHeld[0].Epoch, held[0].Epoch)
	}
	events := b.events(t, tk.ID)
	ev := events[len(events)-1]
	wantReason := "claimed by node-a/dead under epoch 1, bucket now at epoch 2"
	if ev.To != task.Retrying || ev.Node != "node-b" || ev.Epoch != held[0].Epoch || ev.Reason != wantReason {
		t.Errorf("audit event %+v, want retrying by node-b under epoch %d, reason %q", ev, held[0].Epoch, wantReason)
	}

	// The dead owner's attempt completes late: fenced, before and after
	// the successor claims the task again.
	late := func() {
		t.Helper()
		out, err := b.store.AdvanceActive(b.ctx, dead, []store.ActiveTransition{{Ref: tk.Ref(), To: task.Succeeded, Node: "node-a"}})
		if err != nil || !errors.Is(out[0].Err, store.ErrFenced) {
			t.Errorf("late completion of the rescued attempt: %v %+v, want ErrFenced", err, out)
		}
	}
	late()
	b.clock.Advance(testBackoff(1))
	again, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{
		Owner: successor, Node: "node-b", Buckets: held, Kinds: []string{"work"}, Limit: 1, LeaseTTL: taskTTL,
	})
	if err != nil || len(again) != 1 || again[0].Attempt != 2 || again[0].Epoch != held[0].Epoch {
		t.Fatalf("the successor's claim after the backoff: %v %+v, want attempt 2 under epoch %d", err, again, held[0].Epoch)
	}
	late()
	if got := b.get(t, tk.ID); got.Status != task.Running || got.Owner != successor || got.Attempt != 2 {
		t.Errorf("after the late completions the task is %s owned by %q at attempt %d; want the successor's attempt 2 running",
			got.Status, got.Owner, got.Attempt)
	}
}

// The owner that rescues its own expired attempt fences that attempt too.
func TestALateCompletionAfterTheOwnersOwnRescueIsFenced(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 1)
	tk := b.running(t, owner, held, 1, 3)
	b.expire(t, tk)
	b.rescue(t, b.store, owner, held)

	out, err := b.store.AdvanceActive(b.ctx, owner, []store.ActiveTransition{{Ref: tk.Ref(), To: task.Succeeded, Node: "node-a"}})
	if err != nil || !errors.Is(out[0].Err, store.ErrFenced) {
		t.Fatalf("late completion: %v %+v, want ErrFenced", err, out)
	}
	if got := b.get(t, tk.ID); got.Status != task.Retrying {
		t.Errorf("task is %s, want retrying", got.Status)
	}
}

// A completion that lands between the listing and the move wins; the
// rescue reports the conflict and is not an error.
func TestATaskThatMovedMeanwhileIsAConflictInTheReport(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 4)
	tk := b.running(t, owner, held, 4, 3)
	b.expire(t, tk)
	hooked := &hookedStore{Store: b.store, afterListing: func() {
		// The late completion: the owner still holds the bucket under the
		// task's epoch, so its write is not fenced.
		out, err := b.store.AdvanceActive(b.ctx, owner, []store.ActiveTransition{{Ref: tk.Ref(), To: task.Succeeded, Node: "node-a"}})
		if err != nil || out[0].Err != nil {
			t.Errorf("the completion: %v %+v", err, out)
		}
	}}

	rep := b.rescue(t, hooked, owner, held)
	e := entryFor(t, rep, tk.ID)
	if e.Outcome != OutcomeConflict || e.To != task.Succeeded || !strings.Contains(e.Err, "conflict") || rep.Conflicts != 1 {
		t.Errorf("entry %+v (conflicts %d), want a conflict with the task now succeeded", e, rep.Conflicts)
	}
	if rep.Rescued() != 0 {
		t.Errorf("the report counts %d rescued", rep.Rescued())
	}
	if got := b.get(t, tk.ID); got.Status != task.Succeeded {
		t.Errorf("task is %s, want the completion to stand", got.Status)
	}
	for _, ev := range b.events(t, tk.ID) {
		if ev.To == task.Retrying {
			t.Errorf("a retry was recorded after the completion: %+v", ev)
		}
	}
}

// A bucket lost between the listing and the moves is fenced: reported, not
// an error, its other tasks left to its new holder, and the rest of the
// rescue goes on.
func TestABucketLostMeanwhileIsFencedAndLeftAlone(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 5, 6)
	first := b.running(t, owner, held, 5, 3)
	second := b.running(t, owner, held, 5, 3)
	elsewhere := b.running(t, owner, held, 6, 3)
	b.expire(t, first, second, elsewhere)
	hooked := &hookedStore{Store: b.store, afterListing: func() {
		if err := b.store.ExpireBucketLease(5); err != nil {
			t.Error(err)
		}
		b.hold(t, "node-c/3e4f", 5)
	}}

	rep := b.rescue(t, hooked, owner, held)
	if e := entryFor(t, rep, first.ID); e.Outcome != OutcomeFenced || e.To != task.Running || !strings.Contains(e.Err, "fenced") {
		t.Errorf("entry %+v, want fenced", e)
	}
	if len(rep.Entries) != 2 || rep.Fenced != 1 || rep.Retried != 1 || hooked.moves != 2 {
		t.Errorf("report %+v after %d moves; want one fenced move in bucket 5, none more there, and the retry in 6",
			rep, hooked.moves)
	}
	b.unchanged(t, first)
	b.unchanged(t, second)
	if got := b.get(t, elsewhere.ID); got.Status != task.Retrying {
		t.Errorf("the task of bucket 6 is %s, want retrying", got.Status)
	}
}

// A backlog larger than a page is rescued in one call, page by page.
func TestRescuePagesThroughABacklog(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 7)
	var tasks []*task.Task
	for range 5 {
		tasks = append(tasks, b.running(t, owner, held, 7, 3))
	}
	b.expire(t, tasks...)

	rep, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Retried != 5 || rep.Passes != 3 {
		t.Errorf("retried %d in %d passes, want 5 in 3 (pages of 2, 2 and 1)", rep.Retried, rep.Passes)
	}
	for _, tk := range tasks {
		// Without a backoff the retry is due at once.
		if got := b.get(t, tk.ID); got.Status != task.Retrying || got.RunAt.After(b.clock.Now()) {
			t.Errorf("task %d is %s due at %v, want retrying and due now", tk.ID, got.Status, got.RunAt)
		}
	}
}

// A move the store fails to make is one task's outcome: the rescue of the
// others goes on, and the next pass tries the failed one again.
func TestAFailedMoveIsRecordedAndTheRescueGoesOn(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	first := b.running(t, owner, held, 0, 3)
	second := b.running(t, owner, held, 0, 3)
	third := b.running(t, owner, held, 0, 3)
	b.expire(t, first, second, third)
	timedOut := errors.New("canceling statement due to statement timeout")
	hooked := &hookedStore{Store: b.store, failMove: func(n int) error {
		if n == 2 {
			return timedOut
		}
		return nil
	}}

	rep, err := Rescue(b.ctx, hooked, Request{Owner: owner, Node: "node-a", Buckets: held})
	if err != nil {
		t.Fatalf("one failed move ended the rescue: %v", err)
	}
	if rep.Retried != 2 || rep.Failed != 1 || len(rep.Entries) != 3 {
		t.Fatalf("report %+v, want two retries and one failure", rep)
	}
	if e := entryFor(t, rep, second.ID); e.Outcome != OutcomeFailed || !strings.Contains(e.Err, "statement timeout") {
		t.Errorf("entry of the failed move %+v, want OutcomeFailed with the store's error", e)
	}
	b.unchanged(t, second)
	for _, tk := range []*task.Task{first, third} {
		if got := b.get(t, tk.ID); got.Status != task.Retrying {
			t.Errorf("task %d is %s, want retrying", tk.ID, got.Status)
		}
	}

	// The next pass tries it again.
	rep, err = Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held})
	if err != nil || rep.Retried != 1 || entryFor(t, rep, second.ID).Outcome != OutcomeRetried {
		t.Errorf("the next pass: %+v %v, want the failed task retried", rep, err)
	}
}

// A store that fails every move ends the rescue after a few, with an error
// and what was done: a pass does not spend a timeout on every task.
func TestAStoreThatFailsEveryMoveEndsTheRescue(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	var tasks []*task.Task
	for range 5 {
		tasks = append(tasks, b.running(t, owner, held, 0, 3))
	}
	b.expire(t, tasks...)
	unreachable := errors.New("connection refused")
	hooked := &hookedStore{Store: b.store, failMove: func(int) error { return unreachable }}

	rep, err := Rescue(b.ctx, hooked, Request{Owner: owner, Node: "node-a", Buckets: held})
	if err == nil || !strings.Contains(err.Error(), "connection refused") ||
		!strings.Contains(err.Error(), fmt.Sprintf("task %d", tasks[2].ID)) {
		t.Errorf("error %v, want the store's, naming task %d", err, tasks[2].ID)
	}
	if rep.Failed != maxFailuresInARow || len(rep.Entries) != maxFailuresInARow {
		t.Errorf("report %+v, want %d failures and nothing else", rep, maxFailuresInARow)
	}
	for _, tk := range tasks {
		b.unchanged(t, tk)
	}
}

// A task whose row another transaction holds locked is skipped for this
// pass, not waited on: the tasks behind it are rescued.
func TestALockedRowIsSkippedNotWaitedOn(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	locked := b.running(t, owner, held, 0, 3)
	behind := b.running(t, owner, held, 0, 3)
	b.expire(t, locked, behind)
	unlock := b.store.LockTask(locked.ID)
	rep, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held})
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if e := entryFor(t, rep, locked.ID); e.Outcome != OutcomeBusy {
		t.Errorf("entry of the locked task %+v, want OutcomeBusy", e)
	}
	if got := b.get(t, behind.ID); got.Status != task.Retrying {
		t.Errorf("the task behind the locked row is %s, want retrying", got.Status)
	}
	b.unchanged(t, locked)
}

// A rescue given a budget for busy tasks (RetryBusyFor) tries a task
// answered busy again, and moves it once its row is free.
func TestABusyTaskIsTriedAgainWithinTheBudget(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	first := b.running(t, owner, held, 0, 3)
	second := b.running(t, owner, held, 0, 3)
	b.expire(t, first, second)
	locked := fmt.Errorf("%w (database is locked)", store.ErrBusy)
	hooked := &hookedStore{Store: b.store, failMove: func(n int) error {
		if n <= 2 {
			return locked
		}
		return nil
	}}

	rep, err := Rescue(b.ctx, hooked, Request{Owner: owner, Node: "node-a", Buckets: held, RetryBusyFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Retried != 2 || rep.Busy != 0 || hooked.moves != 4 {
		t.Fatalf("report %+v after %d moves asked, want both retried after two busy answers", rep, hooked.moves)
	}
	for _, tk := range []*task.Task{first, second} {
		if got := b.get(t, tk.ID); got.Status != task.Retrying {
			t.Errorf("task %d is %s, want retrying", tk.ID, got.Status)
		}
	}
}

// The budget for busy tasks is the rescue's, not each task's: with two rows
// locked throughout, the first is tried until the pauses (10, 20, 40 ms)
// spend it, and the second once.
func TestTheBusyBudgetIsSpentOncePerRescue(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	first := b.running(t, owner, held, 0, 3)
	second := b.running(t, owner, held, 0, 3)
	b.expire(t, first, second)
	defer b.store.LockTask(first.ID)()
	defer b.store.LockTask(second.ID)()
	hooked := &hookedStore{Store: b.store}

	rep, err := Rescue(b.ctx, hooked, Request{Owner: owner, Node: "node-a", Buckets: held, RetryBusyFor: 70 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Busy != 2 || hooked.moves != 5 {
		t.Fatalf("report %+v after %d moves asked, want both busy after 4 + 1", rep, hooked.moves)
	}
	b.unchanged(t, first)
	b.unchanged(t, second)

	if _, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held, RetryBusyFor: -time.Second}); !errors.Is(err, store.ErrInvalid) ||
		!strings.Contains(err.Error(), "RetryBusyFor is -1s") {
		t.Errorf("a negative RetryBusyFor: %v, want store.ErrInvalid naming it", err)
	}
}

// A caller that still runs an attempt of the task (InUse) is told to stop
// it, and the task is not rescued beside it.
func TestATaskTheCallerStillRunsIsNotRescued(t *testing.T) {
	b := setup(t)
	const owner = "node-a/1a2b"
	held := b.hold(t, owner, 0)
	mine := b.running(t, owner, held, 0, 3)
	other := b.running(t, owner, held, 0, 3)
	b.expire(t, mine, other)
	var asked []int64
	rep, err := Rescue(b.ctx, b.store, Request{Owner: owner, Node: "node-a", Buckets: held,
		InUse: func(tk *task.Task) bool {
			asked = append(asked, tk.ID)
			return tk.ID == mine.ID
		}})
	if err != nil {
		t.Fatal(err)
	}
	if e := entryFor(t, rep, mine.ID); e.Outcome != OutcomeInUse || rep.InUse != 1 {
		t.Errorf("entry of the task still running %+v (report %+v), want OutcomeInUse", e, rep)
	}
	b.unchanged(t, mine)
	if got := b.get(t, other.ID); got.Status != task.Retrying {
		t.Errorf("the other task is %s, want retrying", got.Status)
	}
	if len(asked) != 2 {
		t.Errorf("InUse asked about %v, want both tasks", asked)
	}
}

func TestRescueRefusesARequestItCannotCarryOut(t *testing.T) {
	ok := Request{Owner: "node-a/1a2b", Node: "node-a", Buckets: []store.HeldBucket{{Bucket: 1, Epoch: 1}}}
	cases := []struct {
		name   string
		change func(*Request)
		want   string
	}{
		{"no owner", func(r *Request) { r.Owner = "" }, "Owner"},
		{"no node", func(r *Request) { r.Node = "" }, "Node"},
		{"negative limit", func(r *Request) { r.Limit = -1 }, "Limit is -1"},
		{"negative statement timeout", func(r *Request) { r.StatementTimeout = -time.Second }, "StatementTimeout"},
		{"a bucket named twice", func(r *Request) {
			r.Buckets = append(r.Buckets, store.HeldBucket{Bucket: 1, Epoch: 2})
		}, "bucket 1"},
	}
	b := setup(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := ok
			req.Buckets = append([]store.HeldBucket(nil), ok.Buckets...)
			c.change(&req)
			_, err := Rescue(b.ctx, b.store, req)
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want store.ErrInvalid naming %s", err, c.want)
			}
		})
	}
}

// A caller holding nothing has nothing to rescue, and asks nothing.
func TestRescueWithoutBucketsDoesNothing(t *testing.T) {
	rep, err := Rescue(t.Context(), nil, Request{Owner: "node-a/1a2b", Node: "node-a"})
	if err != nil || len(rep.Entries) != 0 || rep.Passes != 0 {
		t.Errorf("report %+v, error %v", rep, err)
	}
}
