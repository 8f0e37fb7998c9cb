package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// countingStore counts PendingCommands calls. Embedding the interface hides
// the memory store's Listen: a node on it polls only.
type countingStore struct {
	store.Store
	pending atomic.Int64
}

func (s *countingStore) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	s.pending.Add(1)
	return s.Store.PendingCommands(ctx, owner)
}

// startNodeOn starts a node on s (not a handle of the bundle's store).
func startNodeOn(t *testing.T, s store.Store, cfg Config, handlers map[string]Handler) *Node {
	t.Helper()
	n, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for kind, h := range handlers {
		n.Register(kind, h)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("shutdown of %s: %v", n.ID(), err)
		}
	})
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return n
}

// blocking is a handler that reports its start and waits for its context,
// sending the cancellation cause on causes.
func blocking(started chan<- int64, causes chan<- error) Handler {
	return func(ctx context.Context, t *task.Task) error {
		started <- t.ID
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
}

func (b *testBundle) command(t *testing.T, id int64) store.Command {
	t.Helper()
	cmd, err := b.store.GetCommand(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

func TestStoppingATaskAnotherNodeRunsGoesThroughTheCommandChannel(t *testing.T) {
	b := setup(t)
	started, causes := make(chan int64, 1), make(chan error, 1)
	low := bucket.Of(seq(0, 31)...)
	a := b.startNode(t, b.config(t, "a", low.Slice()...), map[string]Handler{"block": blocking(started, causes)})
	b.startNode(t, b.config(t, "b", seq(32, 63)...), map[string]Handler{"block": blocking(started, causes)})

	tk := submit(t, a, SubmitRequest{Kind: "block", Key: b.keysIn(low, 1)[0]})
	receive(t, started, "the handler to start")

	// Issued from a third party: only the store, no node.
	res, err := commands.Stop(b.ctx, b.store.Handle(), tk.ID, "bad deploy", "ops")
	if err != nil {
		t.Fatal(err)
	}
	if res.Direct() || res.Command.Owner != a.Incarnation() || res.Node != "a" {
		t.Fatalf("stop of a running task: %+v; want a command for a's incarnation", res)
	}
	if cause := receive(t, causes, "the handler's context to be cancelled"); !errors.Is(cause, ErrStopRequested) {
		t.Errorf("cancellation cause %v, want ErrStopRequested", cause)
	}
	eventually(t, "the task is stopped", b.statusIs(t, tk.ID, task.Stopped))
	// The note cancels the handler before the command is read; whether the
	// handler's outcome or the command's move to stopping is written first
	// is a race the trail shows.
	if got := b.trail(t, tk.ID); got != "queued running stopped" && got != "queued running stopping stopped" {
		t.Errorf("trail %q, want queued running stopped, or queued running stopping stopped", got)
	}
	events, _ := b.store.TaskEvents(b.ctx, tk.ID)
	for _, e := range events[2:] {
		if e.Node != "a" {
			t.Errorf("event %s written by %q, want the node that ran it", e.To, e.Node)
		}
	}
	cmd, status, err := commands.Wait(b.ctx, b.store, res.Command.ID, time.Millisecond)
	if err != nil || status != task.Stopped || cmd.Outcome != store.OutcomeStopped || cmd.AckedBy != "a" {
		t.Errorf("wait: %+v %s %v; want acknowledged stopped by a", cmd, status, err)
	}
}

func TestANodePollsCommandsFromStartUp(t *testing.T) {
	b := setup(t, withManualClock())
	counting := &countingStore{Store: b.store.Handle()}
	cfg := b.config(t, "a")
	cfg.CommandPoll = time.Second
	startNodeOn(t, counting, cfg, nil) // no kinds: it will never run a task

	eventually(t, "the first poll, at start", func() bool { return counting.pending.Load() >= 1 })
	seen := counting.pending.Load()
	b.advanceUntil(t, "two more polls, one per interval", time.Second, func() bool {
		return counting.pending.Load() >= seen+2
	})
}

func TestAMissedNotificationIsCaughtByThePoll(t *testing.T) {
	b := setup(t)
	started, causes := make(chan int64, 1), make(chan error, 1)
	cfg := b.config(t, "a")
	cfg.CommandPoll = 20 * time.Millisecond
	quiet := &countingStore{Store: b.store.Handle()} // no Listen: every notification is missed
	n := startNodeOn(t, quiet, cfg, map[string]Handler{"block": blocking(started, causes)})
	tk := submit(t, n, SubmitRequest{Kind: "block", Key: "k"})
	receive(t, started, "the handler to start")

	if _, err := commands.Stop(b.ctx, b.store, tk.ID, "", "test"); err != nil {
		t.Fatal(err)
	}
	receive(t, causes, "the handler's context to be cancelled by the poll")
	eventually(t, "the task is stopped", b.statusIs(t, tk.ID, task.Stopped))
}

func TestAStopForADeadHoldersTaskIsHonouredByTheNextHolder(t *testing.T) {
	b := setup(t)
	// The dead holder: a lease and a claim, written as its process would
	// have, and nothing since.
	tk, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "block", Key: "k", Bucket: b.policy.Of("k")}})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{
		Owner: "dead/1", Node: "dead", Buckets: bucket.Of(tk[0].Bucket), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "dead/1", Node: "dead", Kinds: []string{"block"},
		Buckets: []store.HeldBucket{{Bucket: tk[0].Bucket, Epoch: leases[0].Epoch}}, Limit: 1, LeaseTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	res, err := commands.Stop(b.ctx, b.store, tk[0].ID, "", "ops")
	if err != nil {
		t.Fatal(err)
	}
	if cmd := b.command(t, res.Command.ID); cmd.Acked() {
		t.Fatalf("a stop for a dead holder's task was acknowledged by nobody: %+v", cmd)
	}
	if err := b.store.ExpireBucketLease(tk[0].Bucket); err != nil {
		t.Fatal(err)
	}

	started, causes := make(chan int64, 1), make(chan error, 1)
	b.startNode(t, b.config(t, "heir"), map[string]Handler{"block": blocking(started, causes)})
	eventually(t, "the next holder's rescue stops the task", b.statusIs(t, tk[0].ID, task.Stopped))
	if got := b.trail(t, tk[0].ID); got != "queued running stopped" {
		t.Errorf("trail %q, want queued running stopped (never retried)", got)
	}
	if cmd := b.command(t, res.Command.ID); cmd.Outcome != store.OutcomeStopped || cmd.AckedBy != "heir" {
		t.Errorf("command after the rescue: %+v, want acknowledged stopped by heir", cmd)
	}
}

func TestAHandlerThatIgnoresItsStopIsAbandoned(t *testing.T) {
	b := setup(t)
	started, release := make(chan struct{}), make(chan struct{})
	lateWrite := make(chan error, 1)
	cfg := b.config(t, "a")
	cfg.StopGrace = 50 * time.Millisecond
	n := b.startNode(t, cfg, map[string]Handler{"stubborn": func(ctx context.Context, t *task.Task) error {
		close(started)
		<-release // ignores ctx
		lateWrite <- t.SaveProgress(context.Background(), json.RawMessage(`{"late":true}`))
		return nil
	}})
	tk := submit(t, n, SubmitRequest{Kind: "stubborn", Key: "k"})
	receive(t, started, "the handler to start")
	if _, err := commands.Stop(b.ctx, b.store, tk.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task is stopped after the grace period", b.statusIs(t, tk.ID, task.Stopped))
	if got := b.trail(t, tk.ID); got != "queued running stopping stopped" {
		t.Errorf("trail %q", got)
	}
	close(release)
	if err := receive(t, lateWrite, "the abandoned handler's late write"); !errors.Is(err, store.ErrFenced) {
		t.Errorf("late write of an abandoned handler: %v, want store.ErrFenced", err)
	}
	eventually(t, "the abandoned handler is counted out", func() bool { return n.activeHandlers() == 0 })
	if got := b.get(t, tk.ID); got.Status != task.Stopped || got.Progress != nil && string(got.Progress) != "null" {
		t.Errorf("after the late write: %s progress %s, want stopped, no progress", got.Status, got.Progress)
	}
}

// checkpointing is a handler that works in steps, checkpointing between
// them: paused, it saves the steps done; resumed, it carries on from them.
// heldUntil is a handler that closes started and returns only once release
// is closed, whatever its context says: a handler that never checkpoints,
// or one that ignores its stop.
func heldUntil(started chan<- struct{}, release <-chan struct{}) Handler {
	return func(context.Context, *task.Task) error {
		close(started)
		<-release
		return nil
	}
}

func checkpointing(started chan<- json.RawMessage, finish <-chan struct{}) Handler {
	return func(ctx context.Context, t *task.Task) error {
		started <- t.Progress
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for step := 1; ; step++ {
			if err := t.Checkpoint(ctx); errors.Is(err, task.ErrPaused) {
				if err := t.SaveProgress(ctx, json.RawMessage(`{"saved":true}`)); err != nil {
					return err
				}
				return err
			}
			select {
			case <-finish:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
}

func TestPauseAtACheckpointAndResume(t *testing.T) {
	b := setup(t)
	started, finish := make(chan json.RawMessage, 2), make(chan struct{})
	n := b.startNode(t, b.config(t, "a"), map[string]Handler{"steps": checkpointing(started, finish)})
	tk := submit(t, n, SubmitRequest{Kind: "steps", Key: "k"})
	receive(t, started, "the first attempt")

	res, err := commands.Pause(b.ctx, b.store, tk.ID, "maintenance", "ops")
	if err != nil || res.Direct() {
		t.Fatalf("pause of a running task: %+v %v; want a command", res, err)
	}
	eventually(t, "the task is paused", b.statusIs(t, tk.ID, task.Paused))
	if got := b.trail(t, tk.ID); got != "queued running pausing paused" {
		t.Errorf("trail %q, want queued running pausing paused", got)
	}
	// The node acknowledges "pausing" once the handler has been asked; a
	// handler that reaches its checkpoint before that acknowledgement is
	// written has its task paused first, and the move acknowledges the
	// command "paused" (store.LeftOutcome). Either says the pause took.
	if cmd := b.command(t, res.Command.ID); cmd.Outcome != store.OutcomePausing && cmd.Outcome != store.OutcomePaused {
		t.Errorf("pause command %+v, want acknowledged %q or %q", cmd, store.OutcomePausing, store.OutcomePaused)
	}

	if _, err := commands.Resume(b.ctx, b.store, tk.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	if progress := receive(t, started, "the attempt after the resume"); !strings.Contains(string(progress), `"saved"`) {
		t.Errorf("the resumed attempt saw progress %s, want the saved one", progress)
	}
	close(finish)
	eventually(t, "the resumed task succeeds", b.statusIs(t, tk.ID, task.Succeeded))
}

func TestAHandlerThatNeverCheckpointsFinishesDespiteAPause(t *testing.T) {
	b := setup(t)
	started, finish := make(chan struct{}), make(chan struct{})
	n := b.startNode(t, b.config(t, "a"), map[string]Handler{"plain": heldUntil(started, finish)})
	tk := submit(t, n, SubmitRequest{Kind: "plain", Key: "k"})
	receive(t, started, "the handler")
	if _, err := commands.Pause(b.ctx, b.store, tk.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task is pausing", b.statusIs(t, tk.ID, task.Pausing))
	close(finish)
	eventually(t, "the task succeeds", b.statusIs(t, tk.ID, task.Succeeded))
}

// seq is lo..hi.
func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo+1)
	for i := lo; i <= hi; i++ {
		out = append(out, i)
	}
	return out
}

// gatedCommands is a memory store whose PendingCommands waits for open to
// be closed: until then no command can be read, only heard of.
type gatedCommands struct {
	*memory.Store
	open chan struct{}
	read atomic.Int64 // the reads that returned
}

func (s *gatedCommands) PendingCommands(ctx context.Context, owner string) ([]store.Command, error) {
	select {
	case <-s.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer s.read.Add(1)
	return s.Store.PendingCommands(ctx, owner)
}

func TestAStopCancelsTheHandlerOnItsNoteBeforeTheCommandIsRead(t *testing.T) {
	b := setup(t)
	gated := &gatedCommands{Store: b.store.Handle(), open: make(chan struct{})}
	t.Cleanup(gated.Close)
	started, causes := make(chan int64, 1), make(chan error, 1)
	n := startNodeOn(t, gated, b.config(t, "a"), map[string]Handler{"block": blocking(started, causes)})
	tk := submit(t, n, SubmitRequest{Kind: "block", Key: "k"})
	receive(t, started, "the handler to start")

	res, err := commands.Stop(b.ctx, b.store, tk.ID, "", "ops")
	if err != nil {
		t.Fatal(err)
	}
	if cause := receive(t, causes, "the handler's context to be cancelled by the note"); !errors.Is(cause, ErrStopRequested) {
		t.Errorf("cancellation cause %v, want ErrStopRequested", cause)
	}
	if got := gated.read.Load(); got != 0 {
		t.Fatalf("%d command reads returned before the cancellation, want none: the note alone cancels", got)
	}
	// The handler's outcome is written without the command being read:
	// the stop recorded on the task's row redirects it, and answers the
	// command.
	eventually(t, "the task is stopped", b.statusIs(t, tk.ID, task.Stopped))
	if got := b.trail(t, tk.ID); got != "queued running stopped" {
		t.Errorf("trail %q, want queued running stopped", got)
	}
	if cmd := b.command(t, res.Command.ID); cmd.Outcome != store.OutcomeStopped || cmd.AckedBy != "a" {
		t.Errorf("command %+v, want acknowledged stopped by a", cmd)
	}
	// The reads resume; the command, answered, is not applied twice.
	close(gated.open)
	eventually(t, "a command read after the gate opens", func() bool { return gated.read.Load() >= 1 })
	if cmd := b.command(t, res.Command.ID); cmd.Outcome != store.OutcomeStopped {
		t.Errorf("command after the reads resumed: %+v", cmd)
	}
}

func TestAStopNoteNamingAnotherAttemptCancelsNothing(t *testing.T) {
	b := setup(t)
	started, ctxs := make(chan int64, 1), make(chan context.Context, 1)
	cfg := b.config(t, "a")
	cfg.StopGrace = time.Hour
	n := b.startNode(t, cfg, map[string]Handler{"block": func(ctx context.Context, tk *task.Task) error {
		ctxs <- ctx
		started <- tk.ID
		<-ctx.Done()
		return ctx.Err()
	}})
	tk := submit(t, n, SubmitRequest{Kind: "block", Key: "k"})
	receive(t, started, "the handler to start")
	hctx := receive(t, ctxs, "the handler's context")
	running := b.get(t, tk.ID)
	this := store.CommandNote{ID: 99, Owner: n.Incarnation(), TaskID: tk.ID, ClaimSeq: running.ClaimSeq, Kind: store.CommandStop}

	for name, edit := range map[string]func(*store.CommandNote){
		"an earlier claim":     func(c *store.CommandNote) { c.ClaimSeq-- },
		"a later claim":        func(c *store.CommandNote) { c.ClaimSeq++ },
		"another owner":        func(c *store.CommandNote) { c.Owner = "b/1" },
		"no owner":             func(c *store.CommandNote) { c.Owner = "" },
		"another task":         func(c *store.CommandNote) { c.TaskID++ },
		"a pause, not a stop":  func(c *store.CommandNote) { c.Kind = store.CommandPause },
		"an older note format": nil,
	} {
		note := this
		payload := fmt.Sprintf("%d %s", note.ID, note.Owner)
		if edit != nil {
			edit(&note)
			payload = note.Payload()
		}
		// The note is handled in the call: no cancellation has happened by
		// its return, or none will.
		n.notified(store.Notification{Topic: store.TopicCommands, Payload: payload})
		if err := context.Cause(hctx); err != nil {
			t.Fatalf("a note naming %s (%q) cancelled the handler: %v", name, payload, err)
		}
	}
	if got := b.get(t, tk.ID); got.Status != task.Running {
		t.Errorf("task %s after notes for other attempts, want running", got.Status)
	}
	// A stop for this attempt does cancel it.
	if _, err := commands.Stop(b.ctx, b.store, tk.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the handler is cancelled by a stop for its attempt", func() bool { return context.Cause(hctx) != nil })
	eventually(t, "the task is stopped", b.statusIs(t, tk.ID, task.Stopped))
}

// TestAnAbandonedHandlerIsLoggedBeforeItIsCountedOut holds the order that
// keeps a node's last log line inside its Shutdown: an abandoned handler's
// "abandoned" line is written while the handler is still counted, so that
// Shutdown, which waits for the count to reach zero, cannot return (and its
// caller close the log's sink) before the line is out.
func TestAnAbandonedHandlerIsLoggedBeforeItIsCountedOut(t *testing.T) {
	b := setup(t)
	started, release := make(chan struct{}), make(chan struct{})
	var node atomic.Pointer[Node]
	countedWhenLogged := make(chan int, 1)
	cfg := b.config(t, "a")
	cfg.StopGrace = 50 * time.Millisecond
	cfg.Logger = cfg.Logger.WithOptions(zap.Hooks(func(e zapcore.Entry) error {
		if strings.HasPrefix(e.Message, "abandoned:") {
			countedWhenLogged <- node.Load().activeHandlers()
		}
		return nil
	}))
	n := b.startNode(t, cfg, map[string]Handler{"stubborn": heldUntil(started, release)})
	node.Store(n)
	tk := submit(t, n, SubmitRequest{Kind: "stubborn", Key: "k"})
	receive(t, started, "the handler to start")
	if _, err := commands.Stop(b.ctx, b.store, tk.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task is stopped after the grace period", b.statusIs(t, tk.ID, task.Stopped))
	close(release)
	if got := receive(t, countedWhenLogged, "the abandoned handler's log line"); got != 1 {
		t.Errorf("the abandoned handler was logged with %d handlers counted, want 1: it was counted out first", got)
	}
}
