package integration

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

var (
	randomSeed     = flag.Int64("seed", 0, "seed of TestRandomizedConcurrency (0: drawn and printed)")
	randomDuration = flag.Duration("random.duration", 60*time.Second,
		"how long TestRandomizedConcurrency drives the fleet before it checks the ledger")
)

// TestRandomizedConcurrency drives several nodes on one PostgreSQL with
// random work and random interference, for a bounded time, and then checks
// the promises from a ledger the handlers write:
//
//   - no two executions of one task overlapped;
//   - every stop issued while its task was unfinished ended the task stopped
//     or cancelled, or was acknowledged with the final state it lost to;
//   - no task is left active without a live owner;
//   - every audit trail is a chain of allowed transitions.
//
// The handlers succeed, fail, ignore cancellation for a short while, or
// obey it and checkpoint. The driver submits tasks; stops, pauses and
// resumes them at random moments; holds random task rows locked for random
// short spans; crashes nodes (their store is cut off at once: nothing they
// do afterwards reaches the database, as after kill -9) and starts new
// ones; and shuts nodes down gracefully. The seed (-seed) makes the
// sequence of actions reproducible; the timing is the machine's.
func TestRandomizedConcurrency(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	seed := *randomSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -seed %d), duration %v", seed, seed, *randomDuration)
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(seed)>>1|1))

	dsn := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), *randomDuration+5*time.Minute)
	defer cancel()
	admin, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Migrate(ctx, raceBuckets); err != nil {
		t.Fatal(err)
	}
	policy, err := bucket.NewPolicy(raceBuckets)
	if err != nil {
		t.Fatal(err)
	}

	f := &randomFleet{t: t, ctx: ctx, dsn: dsn, admin: admin, policy: policy, ledger: newLedger()}
	// Overlapping declarations: every bucket has a holder and a standby.
	declarations := []bucket.Set{bucket.Of(0, 1, 2, 3, 4, 5), bucket.Of(2, 3, 4, 5, 6, 7), bucket.Of(6, 7, 0, 1)}
	for i, d := range declarations {
		f.start(fmt.Sprintf("n%d", i), d)
	}

	deadline := time.Now().Add(*randomDuration)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var actions [8]int
	for time.Now().Before(deadline) {
		<-tick.C
		// A crash or a shutdown about every 10 s each; the rest every tick.
		switch roll := rng.IntN(1000); {
		case roll < 300:
			f.submit(rng)
			actions[0]++
		case roll < 420:
			f.stop(rng)
			actions[1]++
		case roll < 500:
			f.pause(rng)
			actions[2]++
		case roll < 580:
			f.resume(rng)
			actions[3]++
		case roll < 660:
			f.lockRow(rng)
			actions[4]++
		case roll < 662:
			f.crash(rng)
			actions[5]++
		case roll < 664:
			f.shutdown(rng)
			actions[6]++
		default:
			actions[7]++
		}
	}
	t.Logf("actions: submit %d, stop %d, pause %d, resume %d, lock %d, crash %d, shutdown %d, idle %d",
		actions[0], actions[1], actions[2], actions[3], actions[4], actions[5], actions[6], actions[7])

	f.locks.Wait()
	f.settle()
	f.check()
}

// randomFleet is the fleet under test and what the driver did to it.
type randomFleet struct {
	t      *testing.T
	ctx    context.Context
	dsn    string
	admin  *postgres.Store
	policy bucket.Policy
	ledger *ledger

	mu      sync.Mutex
	nodes   []*randomNode
	started int
	tasks   []int64
	stops   []issuedStop
	locks   sync.WaitGroup
}

type randomNode struct {
	n        *node.Node
	store    *severableStore
	declared bucket.Set
}

type issuedStop struct {
	taskID int64
	res    commands.Result
}

// The behaviours of the "random" kind, chosen at submit.
type behaviour struct {
	Do       string `json:"do"` // succeed, fail, ignore, checkpoint
	Millis   int    `json:"ms"`
	FailFrom int    `json:"fail_until"` // fail attempts before this one
}

func (f *randomFleet) start(prefix string, declared bucket.Set) {
	f.t.Helper()
	f.mu.Lock()
	f.started++
	id := fmt.Sprintf("%s-%d", prefix, f.started)
	f.mu.Unlock()
	// A small pool: crashed and stopped nodes are replaced, and the server's
	// connections are shared with every other test.
	s, err := postgres.New(f.ctx, f.dsn, postgres.WithMaxConns(6))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(s.Close) // Close is safe to call twice
	sev := &severableStore{Store: s, Notifier: s, pg: s}
	n, err := node.New(sev, node.Config{
		NodeID: id, Buckets: declared, Concurrency: 8,
		BucketLeaseTTL: leaseTTL(3 * time.Second), TaskLeaseTTL: leaseTTL(3 * time.Second),
		ReconcileInterval: 200 * time.Millisecond, CommandPoll: 100 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, StopGrace: 500 * time.Millisecond,
		ShutdownTimeout: 300 * time.Millisecond,
		BackoffBase:     10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(f.t, zaptest.Level(zap.WarnLevel)).With(zap.String("test_node", id)),
	})
	if err != nil {
		f.t.Fatal(err)
	}
	n.Register("random", f.handler(id))
	if err := n.Start(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience.Scale(30*time.Second))
		defer cancel()
		_ = n.Shutdown(ctx)
	})
	f.mu.Lock()
	f.nodes = append(f.nodes, &randomNode{n: n, store: sev, declared: declared})
	f.mu.Unlock()
}

// handler runs one attempt as its payload says, and writes it to the ledger.
func (f *randomFleet) handler(nodeID string) node.Handler {
	return func(ctx context.Context, tk *task.Task) error {
		end := f.ledger.begin(tk, nodeID)
		defer end()
		var b behaviour
		if err := json.Unmarshal(tk.Payload, &b); err != nil {
			return fmt.Errorf("%w: payload: %v", task.ErrNoRetry, err)
		}
		d := time.Duration(b.Millis) * time.Millisecond
		switch b.Do {
		case "ignore":
			// Ignores cancellation, briefly: less than any lease's safety
			// margin, so that even a crashed node's handler has returned
			// before the next holder can rescue its task.
			time.Sleep(d)
			return nil
		case "checkpoint":
			for i := 0; i < 10; i++ {
				if err := tk.SaveProgress(ctx, []byte(fmt.Sprintf(`{"step":%d}`, i))); err != nil {
					return err
				}
				if err := tk.Checkpoint(ctx); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(d / 10):
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		if b.Do == "fail" && tk.Attempt < b.FailFrom {
			return errors.New("planned failure")
		}
		return nil
	}
}

func (f *randomFleet) submit(rng *rand.Rand) {
	b := behaviour{Do: []string{"succeed", "fail", "ignore", "checkpoint"}[rng.IntN(4)]}
	switch b.Do {
	case "ignore":
		b.Millis = 1 + rng.IntN(100)
	default:
		b.Millis = 1 + rng.IntN(1500)
	}
	b.FailFrom = 1 + rng.IntN(4)
	payload, _ := json.Marshal(b)
	key := fmt.Sprintf("k-%d", rng.IntN(1000))
	created, err := f.admin.CreateTasks(f.ctx, []store.NewTask{{
		Kind: "random", Key: key, Bucket: f.policy.Of(key), Payload: payload, MaxAttempts: 1 + rng.IntN(3),
	}})
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.tasks = append(f.tasks, created[0].ID)
	f.mu.Unlock()
}

func (f *randomFleet) pick(rng *rand.Rand) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tasks) == 0 {
		return 0, false
	}
	// Mostly recent tasks: they are the ones still running.
	n := len(f.tasks)
	from := max(0, n-30)
	return f.tasks[from+rng.IntN(n-from)], true
}

func (f *randomFleet) stop(rng *rand.Rand) {
	id, ok := f.pick(rng)
	if !ok {
		return
	}
	res, err := commands.Stop(f.ctx, f.admin, id, "random", "driver")
	var tooLate *commands.TooLateError
	switch {
	case errors.As(err, &tooLate):
		return // finished before the stop was decided: not a stop of an unfinished task
	case err != nil:
		f.t.Errorf("stop of task %d: %v", id, err)
		return
	}
	if res.From.Terminal() {
		return
	}
	f.mu.Lock()
	f.stops = append(f.stops, issuedStop{taskID: id, res: res})
	f.mu.Unlock()
}

func (f *randomFleet) pause(rng *rand.Rand) {
	if id, ok := f.pick(rng); ok {
		_, err := commands.Pause(f.ctx, f.admin, id, "random", "driver")
		var tooLate *commands.TooLateError
		var state *commands.StateError
		if err != nil && !errors.As(err, &tooLate) && !errors.As(err, &state) {
			f.t.Errorf("pause of task %d: %v", id, err)
		}
	}
}

func (f *randomFleet) resume(rng *rand.Rand) {
	if id, ok := f.pick(rng); ok {
		_, err := commands.Resume(f.ctx, f.admin, id, "random", "driver")
		var tooLate *commands.TooLateError
		var state *commands.StateError
		if err != nil && !errors.As(err, &tooLate) && !errors.As(err, &state) {
			f.t.Errorf("resume of task %d: %v", id, err)
		}
	}
}

// lockRow holds a random task's row for a random short span, from a
// goroutine of its own, as an operator's transaction would.
func (f *randomFleet) lockRow(rng *rand.Rand) {
	id, ok := f.pick(rng)
	if !ok {
		return
	}
	hold := time.Duration(10+rng.IntN(500)) * time.Millisecond
	f.locks.Add(1)
	go func() {
		defer f.locks.Done()
		tx, err := f.admin.Pool().Begin(f.ctx)
		if err != nil {
			f.t.Errorf("lock of task %d: %v", id, err)
			return
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(f.ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, id); err != nil {
			f.t.Errorf("lock of task %d: %v", id, err)
			return
		}
		time.Sleep(hold) // the span the row stays locked, not a wait for a condition
	}()
}

// takeNode removes a random live node from the fleet, if more than one
// lives.
func (f *randomFleet) takeNode(rng *rand.Rand) *randomNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.nodes) < 2 {
		return nil
	}
	i := rng.IntN(len(f.nodes))
	rn := f.nodes[i]
	f.nodes = append(f.nodes[:i], f.nodes[i+1:]...)
	return rn
}

// crash cuts a node off from the database at once, as kill -9 would: what
// it does afterwards reaches nothing. Its goroutines are then stopped
// (every write fails), and a new node with the same declaration joins.
func (f *randomFleet) crash(rng *rand.Rand) {
	rn := f.takeNode(rng)
	if rn == nil {
		return
	}
	rn.store.sever()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	_ = rn.n.Shutdown(ctx)
	rn.store.pg.Close()
	f.start("crashed", rn.declared)
}

// shutdown stops a node gracefully and starts a new one in its place.
func (f *randomFleet) shutdown(rng *rand.Rand) {
	rn := f.takeNode(rng)
	if rn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if err := rn.n.Shutdown(ctx); err != nil {
		f.t.Errorf("graceful shutdown: %v", err)
	}
	rn.store.pg.Close()
	f.start("restarted", rn.declared)
}

// settle resumes every paused task and waits for every task to finish.
func (f *randomFleet) settle() {
	f.t.Helper()
	within := patience.Scale(3 * time.Minute)
	deadline := time.Now().Add(within)
	for {
		rows, err := f.admin.Pool().Query(f.ctx, `SELECT id, status FROM flotilla_tasks WHERE finished_at IS NULL`)
		if err != nil {
			f.t.Fatal(err)
		}
		var open []string
		var paused []int64
		for rows.Next() {
			var id int64
			var status string
			if err := rows.Scan(&id, &status); err != nil {
				f.t.Fatal(err)
			}
			open = append(open, fmt.Sprintf("%d:%s", id, status))
			if task.Status(status) == task.Paused {
				paused = append(paused, id)
			}
		}
		rows.Close()
		if len(open) == 0 {
			return
		}
		for _, id := range paused {
			_, _ = commands.Resume(f.ctx, f.admin, id, "settle", "driver")
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d tasks still unfinished %v after the run, e.g. %v", len(open), within, open[:min(10, len(open))])
		}
		time.Sleep(100 * time.Millisecond) // polling for the condition above, with its deadline
	}
}

// check reads the ledger and the database and holds them to the promises.
func (f *randomFleet) check() {
	t := f.t
	t.Helper()
	// No two executions of one task overlapped.
	for _, o := range f.ledger.overlaps() {
		t.Error("two executions at once: " + o)
	}

	// Every stop of an unfinished task won, or lost to a final state it
	// names.
	for _, s := range f.stops {
		got, err := f.admin.GetTask(f.ctx, s.taskID)
		if err != nil {
			t.Fatal(err)
		}
		if s.res.Direct() {
			if s.res.Status != task.Cancelled && s.res.Status != task.Stopped {
				t.Errorf("stop of task %d applied directly left it %s", s.taskID, s.res.Status)
			}
			continue
		}
		cmd, err := f.admin.GetCommand(f.ctx, s.res.Command.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !cmd.Acked():
			t.Errorf("stop %d of task %d (now %s) was never acknowledged", cmd.ID, s.taskID, got.Status)
		case cmd.Outcome == store.OutcomeStopped && got.Status == task.Stopped:
		case cmd.Outcome == store.OutcomeFinishedPrefix+string(got.Status) && got.Status != task.Stopped:
		default:
			t.Errorf("stop %d of task %d: acknowledged %q, and the task is %s (trail %s)",
				cmd.ID, s.taskID, cmd.Outcome, got.Status, f.trail(s.taskID))
		}
	}

	// No task is left active without a live owner: everything settled.
	var active int
	if err := f.admin.Pool().QueryRow(f.ctx,
		`SELECT count(*) FROM flotilla_tasks WHERE status IN ('running', 'stopping', 'pausing')`).Scan(&active); err != nil {
		t.Fatal(err)
	}
	if active != 0 {
		t.Errorf("%d tasks are still active after the fleet settled", active)
	}

	// Every trail is a chain of allowed transitions.
	var count int
	for _, id := range f.tasks {
		events, err := f.admin.TaskEvents(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range events {
			if e.Seq != int64(i+1) {
				t.Errorf("task %d: event %d has seq %d", id, i, e.Seq)
			}
			if i == 0 {
				continue
			}
			if prev := events[i-1].To; e.From != prev || !task.CanTransition(e.From, e.To) {
				t.Errorf("task %d: event %d moves %s -> %s after %s (trail %s)", id, i, e.From, e.To, prev, f.trail(id))
			}
		}
		count++
	}
	t.Logf("%d tasks, %d executions, %d stops checked", count, f.ledger.total(), len(f.stops))
}

func (f *randomFleet) trail(id int64) string {
	events, err := f.admin.TaskEvents(f.ctx, id)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, e := range events {
		parts = append(parts, fmt.Sprintf("%s(%s)", e.To, e.Node))
	}
	return strings.Join(parts, " ")
}

// ledger records every execution of every task: which node, which claim,
// from when to when.
type ledger struct {
	mu   sync.Mutex
	runs map[int64][]ledgerRun
	n    atomic.Int64
}

type ledgerRun struct {
	node       string
	claimSeq   int64
	start, end time.Time
}

func newLedger() *ledger { return &ledger{runs: map[int64][]ledgerRun{}} }

func (l *ledger) begin(tk *task.Task, nodeID string) (end func()) {
	l.n.Add(1)
	l.mu.Lock()
	i := len(l.runs[tk.ID])
	l.runs[tk.ID] = append(l.runs[tk.ID], ledgerRun{node: nodeID, claimSeq: tk.ClaimSeq, start: time.Now()})
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.runs[tk.ID][i].end = time.Now()
		l.mu.Unlock()
	}
}

func (l *ledger) total() int64 { return l.n.Load() }

// overlaps describes every pair of executions of one task that overlapped.
func (l *ledger) overlaps() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, runs := range l.runs {
		sorted := append([]ledgerRun(nil), runs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].start.Before(sorted[j].start) })
		for i := 1; i < len(sorted); i++ {
			prev, cur := sorted[i-1], sorted[i]
			if prev.end.IsZero() || cur.start.Before(prev.end) {
				out = append(out, fmt.Sprintf("task %d: claim_seq %d on %s started at %s, before claim_seq %d on %s ended (%s)",
					id, cur.claimSeq, cur.node, cur.start.Format(time.StampMicro), prev.claimSeq, prev.node,
					prev.end.Format(time.StampMicro)))
			}
		}
	}
	return out
}

// severableStore is a node's store that can be cut off at once: from
// sever on, every write fails before it reaches the database, as for a
// process killed with -9. Reads pass through; they change nothing.
type severableStore struct {
	store.Store
	store.Notifier
	pg   *postgres.Store
	dead atomic.Bool
}

var errSevered = errors.New("the node has crashed: its store is cut off")

func (s *severableStore) sever() { s.dead.Store(true) }

func (s *severableStore) cut() error {
	if s.dead.Load() {
		return errSevered
	}
	return nil
}

func (s *severableStore) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.ClaimTasks(ctx, req)
}

func (s *severableStore) RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (store.Renewal, error) {
	if err := s.cut(); err != nil {
		return store.Renewal{}, err
	}
	return s.Store.RenewTaskLeases(ctx, owner, refs, ttl)
}

func (s *severableStore) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.AdvanceActive(ctx, owner, batch)
}

func (s *severableStore) ClaimLimited(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.ClaimLimited(ctx, req, lc)
}

func (s *severableStore) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	if err := s.cut(); err != nil {
		return nil, nil, err
	}
	return s.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
}

func (s *severableStore) SaveProgress(ctx context.Context, owner string, ref task.Ref, progress json.RawMessage) error {
	if err := s.cut(); err != nil {
		return err
	}
	return s.Store.SaveProgress(ctx, owner, ref, progress)
}

func (s *severableStore) Transition(ctx context.Context, tr store.Transition) (*task.Task, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.Transition(ctx, tr)
}

func (s *severableStore) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.AcquireBuckets(ctx, req)
}

func (s *severableStore) ReleaseBuckets(ctx context.Context, owner string, buckets bucket.Set) ([]int, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.ReleaseBuckets(ctx, owner, buckets)
}

func (s *severableStore) HeartbeatNode(ctx context.Context, incarnation string, ttl time.Duration) error {
	if err := s.cut(); err != nil {
		return err
	}
	return s.Store.HeartbeatNode(ctx, incarnation, ttl)
}

func (s *severableStore) StopNode(ctx context.Context, incarnation string) error {
	if err := s.cut(); err != nil {
		return err
	}
	return s.Store.StopNode(ctx, incarnation)
}

func (s *severableStore) AckCommand(ctx context.Context, id int64, by, outcome string) (store.Command, error) {
	if err := s.cut(); err != nil {
		return store.Command{}, err
	}
	return s.Store.AckCommand(ctx, id, by, outcome)
}

func (s *severableStore) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.FireSchedules(ctx, owner, reqs)
}

func (s *severableStore) CreateTasks(ctx context.Context, tasks []store.NewTask) ([]*task.Task, error) {
	if err := s.cut(); err != nil {
		return nil, err
	}
	return s.Store.CreateTasks(ctx, tasks)
}

func (s *severableStore) IssueCommand(ctx context.Context, c store.NewCommand) (store.Command, error) {
	if err := s.cut(); err != nil {
		return store.Command{}, err
	}
	return s.Store.IssueCommand(ctx, c)
}
