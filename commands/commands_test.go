package commands_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

type testBundle struct {
	ctx context.Context
	s   *memory.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), s: memory.New()}
	t.Cleanup(b.s.Close)
	if _, err := b.s.Migrate(b.ctx, 8); err != nil {
		t.Fatal(err)
	}
	return b
}

// inState makes a task in status: queued, scheduled, paused, running (by
// owner "a") or finished as given.
func (b *testBundle) inState(t *testing.T, status task.Status) *task.Task {
	t.Helper()
	nt := store.NewTask{Kind: "k", Key: "x", Bucket: 1}
	if status == task.Scheduled {
		nt.Delay = time.Hour
	}
	if status == task.Pending {
		nt.Pending = true
	}
	created, err := b.s.CreateTasks(b.ctx, []store.NewTask{nt})
	if err != nil {
		t.Fatal(err)
	}
	tk := created[0]
	switch status {
	case task.Queued, task.Scheduled, task.Pending:
		return tk
	case task.Paused, task.Cancelled:
		tk, err = b.s.Transition(b.ctx, store.Transition{ID: tk.ID, Version: tk.StatusVersion, To: status})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "a", Node: "a", Buckets: bucket.Of(1), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := b.s.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "a", Node: "a", Kinds: []string{"k"}, Limit: 1,
		Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}, LeaseTTL: time.Hour})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	tk = claimed[0]
	if status != task.Running {
		out, err := b.s.AdvanceActive(b.ctx, "a", []store.ActiveTransition{{Ref: tk.Ref(), To: status}})
		if err != nil || out[0].Err != nil {
			t.Fatalf("advance to %s: %v %v", status, err, out)
		}
		tk, _ = b.s.GetTask(b.ctx, tk.ID)
	}
	return tk
}

func TestStop(t *testing.T) {
	for _, tc := range []struct {
		from    task.Status
		want    task.Status
		command bool
		tooLate bool
	}{
		{from: task.Queued, want: task.Cancelled},
		{from: task.Scheduled, want: task.Cancelled},
		{from: task.Pending, want: task.Cancelled},
		{from: task.Paused, want: task.Cancelled},
		{from: task.Cancelled, want: task.Cancelled},
		{from: task.Running, want: task.Running, command: true},
		{from: task.Succeeded, tooLate: true},
	} {
		t.Run(string(tc.from), func(t *testing.T) {
			b := setup(t)
			tk := b.inState(t, tc.from)
			res, err := commands.Stop(b.ctx, b.s, tk.ID, "why", "ops")
			if tc.tooLate {
				var tl *commands.TooLateError
				if !errors.As(err, &tl) || tl.Status != tc.from {
					t.Fatalf("stop of a %s task: %v, want *TooLateError naming it", tc.from, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want || res.Direct() == tc.command {
				t.Errorf("stop of a %s task: %+v, want %s (command: %v)", tc.from, res, tc.want, tc.command)
			}
			// What the CLI prints: the state the stop found, and for a
			// command the node that runs the task.
			wantNode := ""
			if tc.command {
				wantNode = "a"
			}
			if res.From != tc.from || res.Node != wantNode || res.TaskID != tk.ID || res.Kind != store.CommandStop {
				t.Errorf("stop of a %s task reported from %s, node %q, task %d, kind %s; want from %s, node %q, task %d",
					tc.from, res.From, res.Node, res.TaskID, res.Kind, tc.from, wantNode, tk.ID)
			}
		})
	}
}

func TestPauseAndResume(t *testing.T) {
	b := setup(t)
	tk := b.inState(t, task.Queued)
	if res, err := commands.Pause(b.ctx, b.s, tk.ID, "", "ops"); err != nil || res.Status != task.Paused {
		t.Fatalf("pause of a queued task: %+v %v", res, err)
	}
	if res, err := commands.Resume(b.ctx, b.s, tk.ID, "", "ops"); err != nil || res.Status != task.Queued {
		t.Fatalf("resume of a paused task: %+v %v", res, err)
	}
	var se *commands.StateError
	if _, err := commands.Resume(b.ctx, b.s, tk.ID, "", "ops"); !errors.As(err, &se) || se.Status != task.Queued {
		t.Errorf("resume of a queued task: %v, want *StateError naming queued", err)
	}
	running := b.inState(t, task.Running)
	if res, err := commands.Pause(b.ctx, b.s, running.ID, "", "ops"); err != nil || res.Direct() {
		t.Errorf("pause of a running task: %+v %v, want a command", res, err)
	}
}

func TestMissingTask(t *testing.T) {
	b := setup(t)
	for name, fn := range map[string]func(context.Context, store.Store, int64, string, string) (commands.Result, error){
		"stop": commands.Stop, "pause": commands.Pause, "resume": commands.Resume,
	} {
		if _, err := fn(b.ctx, b.s, 4242, "", ""); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s of a missing task: %v, want store.ErrNotFound", name, err)
		}
	}
}

func TestWaitReportsATaskThatFinishedFirst(t *testing.T) {
	b := setup(t)
	tk := b.inState(t, task.Running)
	res, err := commands.Stop(b.ctx, b.s, tk.ID, "", "ops")
	if err != nil {
		t.Fatal(err)
	}
	// The handler had finished: the stop never wins over a success.
	if out, err := b.s.AdvanceActive(b.ctx, "a", []store.ActiveTransition{{Ref: tk.Ref(), To: task.Succeeded}}); err != nil || out[0].Status != task.Succeeded {
		t.Fatalf("success with a stop pending: %v %v", out, err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	_, status, err := commands.Wait(ctx, b.s, res.Command.ID, time.Millisecond)
	var tl *commands.TooLateError
	if !errors.As(err, &tl) || tl.Status != task.Succeeded || status != task.Succeeded {
		t.Errorf("wait: %s %v, want *TooLateError naming succeeded", status, err)
	}
}

// countingStore counts PendingCommands calls.
type countingStore struct {
	store.Store
	pending atomic.Int64
}

func (s *countingStore) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	s.pending.Add(1)
	return s.Store.PendingCommands(ctx, owner)
}

// TestAPureClientNeverConsumesCommands: DESIGN invariant 8.
func TestAPureClientNeverConsumesCommands(t *testing.T) {
	b := setup(t)
	cs := &countingStore{Store: b.s}
	c, err := flotilla.NewClient(b.ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := c.Submit(b.ctx, flotilla.TaskRequest{Kind: "k", Key: "x"}, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	running := b.inState(t, task.Running)
	if _, err := c.Pause(b.ctx, tk.ID, flotilla.By("ops")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(b.ctx, tk.ID, flotilla.By("ops")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stop(b.ctx, tk.ID, flotilla.By("ops")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Stop(b.ctx, running.ID, flotilla.By("ops"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Millisecond)
	defer cancel()
	if _, _, err := c.WaitCommand(ctx, res.Command.ID, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait for a command nobody applies: %v, want the deadline", err)
	}
	if _, err := c.Get(b.ctx, tk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(b.ctx, store.TaskFilter{}); err != nil {
		t.Fatal(err)
	}
	if n := cs.pending.Load(); n != 0 {
		t.Errorf("a pure client called PendingCommands %d times", n)
	}
}

// A task paused while it waited for its delay keeps waiting for the time
// that was left when it is resumed; one whose time has come is queued.
func TestResumeOfADelayedTaskKeepsItsDelay(t *testing.T) {
	b := setup(t)
	delayed := b.inState(t, task.Scheduled) // due in an hour
	if res, err := commands.Pause(b.ctx, b.s, delayed.ID, "", "ops"); err != nil || res.Status != task.Paused {
		t.Fatalf("pause of a delayed task: %+v %v", res, err)
	}
	res, err := commands.Resume(b.ctx, b.s, delayed.ID, "", "ops")
	if err != nil || res.Status != task.Scheduled {
		t.Fatalf("resume of a delayed task: %+v %v, want scheduled", res, err)
	}
	got, err := b.s.GetTask(b.ctx, delayed.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.RunAt.Sub(delayed.RunAt); d < -time.Second || d > time.Second {
		t.Errorf("resumed task runs at %v, want about %v, when its delay ends", got.RunAt, delayed.RunAt)
	}

	due := b.inState(t, task.Queued)
	if _, err := commands.Pause(b.ctx, b.s, due.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	if res, err := commands.Resume(b.ctx, b.s, due.ID, "", "ops"); err != nil || res.Status != task.Queued {
		t.Errorf("resume of a task that was due: %+v %v, want queued", res, err)
	}
}
