package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// The tests in this file force, against real PostgreSQL and with real row
// locks, the interleavings that once broke the core promise: a task never
// runs twice at once, a stop reaches the task and wins, and a graceful
// shutdown loses nothing. Each waits for the lock queue or the handlers to
// be where the interleaving needs them; none sleeps and hopes.

// raceBuckets is the fleet's bucket count in these tests: small, so that a
// node can be told exactly which buckets it holds.
const raceBuckets = 8

type raceRig struct {
	t      *testing.T
	ctx    context.Context
	store  *postgres.Store
	policy bucket.Policy
	all    bucket.Set
}

func newRaceRig(t *testing.T) *raceRig {
	t.Helper()
	needsIntegration(t)
	dsn := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // after the nodes' shutdowns, registered later
	if _, err := s.Migrate(ctx, raceBuckets); err != nil {
		t.Fatal(err)
	}
	policy, err := bucket.NewPolicy(raceBuckets)
	if err != nil {
		t.Fatal(err)
	}
	return &raceRig{t: t, ctx: ctx, store: s, policy: policy, all: bucket.All(raceBuckets)}
}

// node starts a node on the rig's store. Shutdown at the end of the test is
// the node's own business unless the test shut it down already.
func (r *raceRig) node(id string, buckets bucket.Set, cfg node.Config, handlers map[string]node.Handler) *node.Node {
	r.t.Helper()
	cfg.NodeID, cfg.Buckets = id, buckets
	cfg.Logger = zaptest.NewLogger(r.t, zaptest.Level(zap.InfoLevel)).With(zap.String("test_node", id))
	n, err := node.New(r.store, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	for kind, h := range handlers {
		n.Register(kind, h)
	}
	if err := n.Start(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Shutdown(ctx)
	})
	return n
}

// submit creates a task whose key hashes into set.
func (r *raceRig) submit(kind string, set bucket.Set, prefix string, maxAttempts int) *task.Task {
	r.t.Helper()
	key := keyIn(r.t, r.policy, set, prefix)
	created, err := r.store.CreateTasks(r.ctx, []store.NewTask{{
		Kind: kind, Key: key, Bucket: r.policy.Of(key), MaxAttempts: maxAttempts,
	}})
	if err != nil {
		r.t.Fatal(err)
	}
	return created[0]
}

func (r *raceRig) get(id int64) *task.Task {
	r.t.Helper()
	got, err := r.store.GetTask(r.ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	return got
}

func (r *raceRig) trail(id int64) string {
	r.t.Helper()
	events, err := r.store.TaskEvents(r.ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	var parts []string
	for _, e := range events {
		parts = append(parts, string(e.To))
	}
	return strings.Join(parts, " ")
}

func (r *raceRig) waitStatus(id int64, what string, ok func(task.Status) bool) *task.Task {
	r.t.Helper()
	var got *task.Task
	eventually(r.t, time.Minute, what, func() bool {
		got = r.get(id)
		return ok(got.Status)
	})
	return got
}

func is(statuses ...task.Status) func(task.Status) bool {
	return func(s task.Status) bool {
		for _, want := range statuses {
			if s == want {
				return true
			}
		}
		return false
	}
}

// lockRow holds a task's row in a transaction of its own, as an operator's
// open transaction would, until unlock (or the end of the test).
func (r *raceRig) lockRow(id int64) (unlock func()) {
	r.t.Helper()
	tx, err := r.store.Pool().Begin(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := tx.Exec(r.ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, id); err != nil {
		_ = tx.Rollback(r.ctx)
		r.t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	r.t.Cleanup(unlock)
	return unlock
}

// waitLockWaiters waits until at least n statements of this database wait
// for a lock.
func (r *raceRig) waitLockWaiters(n int, what string) {
	r.t.Helper()
	eventually(r.t, time.Minute, what, func() bool {
		var waiting int
		err := r.store.Pool().QueryRow(r.ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting >= n
	})
}

// executions records when handlers run, to find two executions of one task
// at the same time.
type executions struct {
	mu       sync.Mutex
	running  map[int64]int
	started  map[int64]int
	overlaps []string
}

func newExecutions() *executions {
	return &executions{running: map[int64]int{}, started: map[int64]int{}}
}

// begin records an execution's start; end records its end.
func (e *executions) begin(t *task.Task) (end func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.started[t.ID]++
	e.running[t.ID]++
	if e.running[t.ID] > 1 {
		e.overlaps = append(e.overlaps, fmt.Sprintf("task %d attempt %d (claim_seq %d) started while another ran",
			t.ID, t.Attempt, t.ClaimSeq))
	}
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.running[t.ID]--
	}
}

func (e *executions) startedCount(id int64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.started[id]
}

func (e *executions) check(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, o := range e.overlaps {
		t.Error("two executions at once: " + o)
	}
}

// Case 1. Another transaction holds one running task's row locked. The
// node's renewal must not stall on it (or the other tasks' leases lapse and
// the node's own rescue runs them a second time beside the first); the
// locked task's handler is stopped at its own local deadline, and the task
// is rescued and run again only once that handler has returned.
func TestALockedRowNeverMakesANodeRunATaskTwice(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	runs := newExecutions()
	causes := make(chan struct {
		id    int64
		cause error
	}, 16)
	release := make(chan struct{})
	n := r.node("a", r.all, node.Config{
		TaskLeaseTTL: 3 * time.Second, ReconcileInterval: 200 * time.Millisecond,
		BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
	}, map[string]node.Handler{
		"hold": func(ctx context.Context, tk *task.Task) error {
			defer runs.begin(tk)()
			if tk.Attempt > 1 {
				return nil
			}
			select {
			case <-ctx.Done():
				causes <- struct {
					id    int64
					cause error
				}{tk.ID, context.Cause(ctx)}
				return ctx.Err()
			case <-release:
				return nil
			}
		},
	})
	locked := r.submit("hold", r.all, "locked", 3)
	other := r.submit("hold", r.all, "other", 3)
	eventually(t, time.Minute, "both handlers run", func() bool {
		return runs.startedCount(locked.ID) == 1 && runs.startedCount(other.ID) == 1
	})

	unlock := r.lockRow(locked.ID)
	got := <-causes
	if got.id != locked.ID || !errors.Is(got.cause, node.ErrTaskLeaseLost) {
		t.Fatalf("handler of task %d cancelled with %v; want the locked task %d's, with ErrTaskLeaseLost",
			got.id, got.cause, locked.ID)
	}
	unlock()
	// The rescue that found the locked task expired ran after the other
	// task's lease would have lapsed, had the renewals stalled.
	r.waitStatus(locked.ID, "the locked task is rescued and run again", is(task.Succeeded))
	if trail := r.trail(locked.ID); trail != "queued running retrying running succeeded" {
		t.Errorf("locked task's trail %q", trail)
	}
	if runs.startedCount(other.ID) != 1 {
		t.Errorf("the other task ran %d times while its first handler never stopped", runs.startedCount(other.ID))
	}
	if cur := r.get(other.ID); cur.Status != task.Running || cur.ClaimSeq != 1 {
		t.Errorf("the other task is %s at claim_seq %d, want still running its first attempt", cur.Status, cur.ClaimSeq)
	}
	close(release)
	r.waitStatus(other.ID, "the other task finishes", is(task.Succeeded))
	runs.check(t)
	_ = n
}

// issueHookStore runs a hook before each command is issued: the moment
// between the issuer's read of the task and its write.
type issueHookStore struct {
	store.Store
	beforeIssue func()
}

func (s *issueHookStore) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	if s.beforeIssue != nil {
		s.beforeIssue()
	}
	return s.Store.IssueCommand(ctx, c)
}

// Case 2a. The issuer of a stop reads the task running; before its command
// is written, the attempt fails and the task goes to retrying. The command
// must not land on the retry (nothing would stop it from running again): the
// issuer decides again, and cancels the waiting task.
func TestAStopDecidedOnARunningTaskIsNotLostWhenTheAttemptFailsFirst(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	fail := make(chan struct{})
	r.node("a", r.all, node.Config{BackoffBase: time.Hour, BackoffMax: time.Hour}, map[string]node.Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			select {
			case <-fail:
				return errors.New("boom")
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	tk := r.submit("work", r.all, "stop-race", 3)
	r.waitStatus(tk.ID, "the task runs", is(task.Running))

	hooked := &issueHookStore{Store: r.store}
	var once sync.Once
	hooked.beforeIssue = func() {
		once.Do(func() {
			close(fail)
			r.waitStatus(tk.ID, "the attempt fails first", is(task.Retrying))
		})
	}
	res, err := commands.Stop(r.ctx, hooked, tk.ID, "race", "test")
	if err != nil {
		t.Fatal(err)
	}
	got := r.get(tk.ID)
	if got.Status != task.Cancelled || res.Status != task.Cancelled || !res.Direct() {
		t.Fatalf("stop: %+v; task %s (trail %q): want the retry cancelled directly", res, got.Status, r.trail(tk.ID))
	}
	if got.StopRequested {
		t.Error("the cancelled task still has a stop requested")
	}
}

// Case 2b. A completion waits for the task's row lock (another transaction
// holds it, as the node's own renewal does now and then); a stop is issued
// meanwhile. In any serial order the task ends stopped (the stop first) or
// cancelled (the failure first, then the stop of a waiting task).
func TestAStopIssuedWhileACompletionWaitsForTheRowWins(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	fail := make(chan struct{})
	r.node("a", r.all, node.Config{BackoffBase: time.Hour, BackoffMax: time.Hour}, map[string]node.Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			select {
			case <-fail:
				return errors.New("boom")
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	tk := r.submit("work", r.all, "completion-race", 3)
	r.waitStatus(tk.ID, "the task runs", is(task.Running))

	unlock := r.lockRow(tk.ID)
	close(fail)
	r.waitLockWaiters(1, "the completion waits for the row")
	stopped := make(chan error, 1)
	var res commands.Result
	go func() {
		var err error
		res, err = commands.Stop(r.ctx, r.store, tk.ID, "race", "test")
		stopped <- err
	}()
	r.waitLockWaiters(2, "the stop waits for the row too")
	unlock()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	got := r.waitStatus(tk.ID, "the task ends", func(s task.Status) bool { return s.Terminal() })
	if got.Status != task.Stopped && got.Status != task.Cancelled {
		t.Fatalf("task is %s after the stop (%+v), trail %q: want stopped or cancelled", got.Status, res, r.trail(tk.ID))
	}
	if !res.Direct() {
		cmd, err := r.store.GetCommand(r.ctx, res.Command.ID)
		if err != nil || cmd.Outcome != store.OutcomeStopped {
			t.Errorf("the stop command: %+v %v, want acknowledged %q", cmd, err, store.OutcomeStopped)
		}
	}
}

// Case 3. A task asked to pause whose handler never reaches a checkpoint is
// still pausing when the node shuts down. It cannot go back to queued; it
// is paused, with the progress it saved, and nothing is refused.
func TestShutdownPausesAPausingTask(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	running := make(chan struct{})
	n := r.node("a", r.all, node.Config{ShutdownTimeout: 100 * time.Millisecond}, map[string]node.Handler{
		"work": func(ctx context.Context, tk *task.Task) error {
			if err := tk.SaveProgress(ctx, []byte(`{"done":3}`)); err != nil {
				return err
			}
			close(running)
			<-ctx.Done() // never checkpoints
			return ctx.Err()
		},
	})
	tk := r.submit("work", r.all, "pausing", 1)
	<-running
	if _, err := commands.Pause(r.ctx, r.store, tk.ID, "maintenance", "test"); err != nil {
		t.Fatal(err)
	}
	r.waitStatus(tk.ID, "the task is pausing", is(task.Pausing))
	if err := n.Shutdown(r.ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	got := r.get(tk.ID)
	if got.Status != task.Paused || string(got.Progress) != `{"done": 3}` {
		t.Fatalf("after shutdown the task is %s with progress %s (trail %q), want paused with its progress",
			got.Status, got.Progress, r.trail(tk.ID))
	}
	if trail := r.trail(tk.ID); trail != "queued running pausing paused" {
		t.Errorf("trail %q, want queued running pausing paused", trail)
	}
}

// Case 4. A handler ignores its cancellation past the shutdown timeout. Its
// bucket's lease is not released (a standby would take it at once and run
// the task again beside the live handler): it lapses as after a crash.
// Every other bucket is handed over at once.
func TestShutdownKeepsTheLeaseOfABucketWhoseHandlerStillRuns(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	a := r.node("a", r.all, node.Config{ShutdownTimeout: 50 * time.Millisecond}, map[string]node.Handler{
		"stubborn": func(ctx context.Context, tk *task.Task) error {
			close(started)
			<-release // ignores ctx
			return nil
		},
	})
	b := r.node("b", r.all, node.Config{}, map[string]node.Handler{"stubborn": func(context.Context, *task.Task) error {
		t.Error("the standby ran the task while its first handler still ran")
		return nil
	}})
	tk := r.submit("stubborn", r.all, "stubborn", 3)
	<-started

	sctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
	defer cancel()
	if err := a.Shutdown(sctx); err == nil {
		t.Fatal("shutdown returned no error though a handler never returned")
	}
	rest := r.all.Minus(bucket.Of(tk.Bucket))
	eventually(t, time.Minute, "the standby takes every other bucket", func() bool {
		var held []int
		for _, h := range b.Held() {
			held = append(held, h.Bucket)
		}
		return bucket.Of(held...).Equal(rest)
	})
	var owner string
	if err := r.store.Pool().QueryRow(r.ctx,
		`SELECT coalesce(owner, '') FROM flotilla_bucket_leases WHERE bucket = $1 AND expires_at > statement_timestamp()`,
		tk.Bucket).Scan(&owner); err != nil {
		t.Fatalf("bucket %d's lease: %v (released or expired)", tk.Bucket, err)
	}
	if owner != a.Incarnation() {
		t.Errorf("bucket %d is held by %q, want the stopped node %s until its lease lapses", tk.Bucket, owner, a.Incarnation())
	}
}

// Case 5. One expired task's row is locked by another transaction. The
// rescue must not wait for it (and so not stall every expired task behind
// it at every pass): it skips it for this pass and rescues the rest.
func TestRescueSkipsALockedRowAndRescuesTheRest(t *testing.T) {
	t.Parallel()
	r := newRaceRig(t)
	const owner = "rescuer/1"
	leases, err := r.store.AcquireBuckets(r.ctx, store.AcquireRequest{Owner: owner, Node: "rescuer", Buckets: r.all, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held := make([]store.HeldBucket, len(leases))
	for i, l := range leases {
		held[i] = store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch}
	}
	first := r.submit("work", r.all, "first", 3)
	second := r.submit("work", r.all, "second", 3)
	claimed, err := r.store.ClaimTasks(r.ctx, store.ClaimRequest{Owner: owner, Node: "rescuer", Buckets: held,
		Kinds: []string{"work"}, Limit: 10, LeaseTTL: time.Minute})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := r.store.Pool().Exec(r.ctx,
		`UPDATE flotilla_tasks SET lease_expires_at = statement_timestamp() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	unlock := r.lockRow(first.ID)
	defer unlock()
	rep, err := reconcile.Rescue(r.ctx, r.store, reconcile.Request{
		Owner: owner, Node: "rescuer", Buckets: held, StatementTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[int64]reconcile.Outcome{}
	for _, e := range rep.Entries {
		outcomes[e.TaskID] = e.Outcome
	}
	if outcomes[first.ID] != reconcile.OutcomeBusy || outcomes[second.ID] != reconcile.OutcomeRetried {
		t.Fatalf("outcomes %v, want task %d busy and task %d retried", outcomes, first.ID, second.ID)
	}
	if got := r.get(first.ID); got.Status != task.Running {
		t.Errorf("the locked task is %s, want untouched", got.Status)
	}
}
