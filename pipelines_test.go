package flotilla_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// pipelineBundle is a client and a node on one store, with handlers whose
// attempts the test holds until it lets them go.
type pipelineBundle struct {
	ctx    context.Context
	store  store.Store
	client *flotilla.Client

	mu      sync.Mutex
	release map[string]chan struct{} // by step: closed to let its handler return
	started map[string]int           // attempts started, by step
}

// onEveryStore runs test on the memory, SQLite and PostgreSQL stores.
func onEveryStore(t *testing.T, test func(t *testing.T, b *pipelineBundle)) {
	t.Run("memory", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		s, c := memoryClient(t, ctx)
		test(t, newPipelineBundle(t, ctx, s, c))
	})
	t.Run("sqlite", func(t *testing.T) {
		ctx, s, c, _ := sqliteClient(t)
		test(t, newPipelineBundle(t, ctx, s, c))
	})
	t.Run("postgres", func(t *testing.T) {
		b := setup(t)
		test(t, newPipelineBundle(t, b.ctx, b.store, b.client))
	})
}

// memoryClient is a migrated memory store and a client on it.
func memoryClient(t *testing.T, ctx context.Context) (*memory.Store, *flotilla.Client) {
	t.Helper()
	s := memory.New()
	if _, err := s.Migrate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// newPipelineBundle starts a node holding every bucket with two kinds:
// "hold" runs until the test releases its step, checkpointing as it waits,
// and "deaf" runs until released and never checkpoints; "work" returns at
// once.
func newPipelineBundle(t *testing.T, ctx context.Context, s store.Store, c *flotilla.Client) *pipelineBundle {
	t.Helper()
	b := &pipelineBundle{ctx: ctx, store: s, client: c, release: map[string]chan struct{}{}, started: map[string]int{}}
	n, err := node.New(s, node.Config{
		NodeID: "solo", AllBuckets: true, Logger: zap.NewNop(),
		PollInterval: 20 * time.Millisecond, CommandPoll: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(checkpoints bool) node.Handler {
		return func(ctx context.Context, tk *task.Task) error {
			b.mu.Lock()
			b.started[tk.Step]++
			ch := b.releaseOf(tk.Step)
			b.mu.Unlock()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ch:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
					if !checkpoints {
						continue
					}
					if err := tk.Checkpoint(ctx); err != nil {
						return err
					}
				}
			}
		}
	}
	n.Register("hold", wait(true))
	n.Register("deaf", wait(false))
	n.Register("work", func(ctx context.Context, tk *task.Task) error {
		b.mu.Lock()
		b.started[tk.Step]++
		b.mu.Unlock()
		return nil
	})
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.mu.Lock()
		for _, ch := range b.release {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		b.mu.Unlock()
		_ = n.Shutdown(context.Background())
	})
	return b
}

// releaseOf is the channel that lets step's handler return; b.mu is held.
func (b *pipelineBundle) releaseOf(step string) chan struct{} {
	ch := b.release[step]
	if ch == nil {
		ch = make(chan struct{})
		b.release[step] = ch
	}
	return ch
}

func (b *pipelineBundle) let(step string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.releaseOf(step))
}

func (b *pipelineBundle) startedCount(step string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started[step]
}

func (b *pipelineBundle) submit(t *testing.T, steps ...task.Step) store.Pipeline {
	t.Helper()
	p, err := b.client.SubmitPipeline(b.ctx, flotilla.PipelineRequest{Name: "ops", Steps: steps})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// statuses is "name=status ..." of the pipeline's steps as stored now.
func (b *pipelineBundle) statuses(t *testing.T, id int64) string {
	t.Helper()
	p, err := b.client.GetPipeline(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range p.Steps {
		out = append(out, s.Name+"="+string(s.Task.Status))
	}
	return strings.Join(out, " ")
}

func (b *pipelineBundle) waitFor(t *testing.T, id int64, want string) {
	t.Helper()
	var got string
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for got = b.statuses(t, id); got != want; got = b.statuses(t, id) {
		if time.Now().After(deadline) {
			t.Fatalf("pipeline is %s after 30s, want %s", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// acted is "step:from->status[+command] ..." of the results, by step name.
func acted(rs []flotilla.PipelineStepResult) string {
	var out []string
	for _, r := range rs {
		s := r.Step + ":" + string(r.From) + "->" + string(r.Status)
		if !r.Direct() {
			s += "+" + r.Command.Kind
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func pstep(name, kind string, deps ...string) task.Step {
	s := task.Step{Name: name, Kind: kind, MaxAttempts: 1}
	for _, d := range deps {
		s.DependsOn = append(s.DependsOn, task.Dependency{Step: d})
	}
	return s
}

// Stopping a pipeline stops its running step through the command channel,
// cancels its waiting steps (skipping their dependents) and leaves its
// finished steps as they ended.
func TestStopPipelineStopsWhatRunsAndCancelsWhatWaits(t *testing.T) {
	onEveryStore(t, func(t *testing.T, b *pipelineBundle) {
		p := b.submit(t, pstep("done", "work"), pstep("a", "hold"), pstep("b", "work", "a"), pstep("c", "work", "b"))
		b.waitFor(t, p.ID, "done=succeeded a=running b=pending c=pending")
		rs, err := b.client.StopPipeline(b.ctx, p.ID, flotilla.Reason("maintenance"), flotilla.By("ops"))
		if err != nil {
			t.Fatal(err)
		}
		// Dependents first: c and b are cancelled before a gets its stop
		// command, so neither is skipped by a's end.
		if got, want := acted(rs), "a:running->running+stop b:pending->cancelled c:pending->cancelled"; got != want {
			t.Errorf("stop acted %q, want %q", got, want)
		}
		b.waitFor(t, p.ID, "done=succeeded a=stopped b=cancelled c=cancelled")
		if n := b.startedCount("b") + b.startedCount("c"); n != 0 {
			t.Errorf("%d attempts of b and c started after the stop", n)
		}
		if _, err := b.client.StopPipeline(b.ctx, 1<<40, flotilla.By("ops")); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("stop of a missing pipeline: %v, want store.ErrNotFound", err)
		}
	})
}

// Stopping a pipeline releases none of its clean-up steps: each step that
// runs when a dependency fails, or whatever it ends as, is cancelled while
// still pending, before the stop ends its dependency, so that none is ever
// queued to start. The dependency here waits in the queue (no node runs its
// kind), so that its cancellation would be at once.
func TestStopPipelineReleasesNoCleanUpStep(t *testing.T) {
	onEveryStore(t, func(t *testing.T, b *pipelineBundle) {
		onFailure := pstep("undo", "work", "a")
		onFailure.DependsOn[0].On = task.OnFailure
		onAny := pstep("report", "work", "a")
		onAny.DependsOn[0].On = task.OnAny
		p := b.submit(t, onFailure, onAny, pstep("a", "unserved"))
		b.waitFor(t, p.ID, "a=queued undo=pending report=pending")
		rs, err := b.client.StopPipeline(b.ctx, p.ID, flotilla.By("ops"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := acted(rs), "a:queued->cancelled report:pending->cancelled undo:pending->cancelled"; got != want {
			t.Errorf("stop acted %q, want %q", got, want)
		}
		b.waitFor(t, p.ID, "a=cancelled undo=cancelled report=cancelled")
		got, err := b.client.GetPipeline(b.ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range got.Steps {
			if s.Name == "a" {
				continue
			}
			events, err := b.client.Store().TaskEvents(b.ctx, s.Task.ID)
			if err != nil {
				t.Fatal(err)
			}
			var trail []string
			for _, e := range events {
				trail = append(trail, string(e.To))
			}
			if strings.Join(trail, " ") != "pending cancelled" {
				t.Errorf("clean-up step %s went %v, want pending then cancelled: it was released by the stop", s.Name, trail)
			}
		}
		if n := b.startedCount("undo") + b.startedCount("report"); n != 0 {
			t.Errorf("%d attempts of the clean-up steps started after the stop", n)
		}
	})
}

// Pausing a pipeline pauses its running step at its checkpoint and its
// waiting steps at once; resuming queues the steps whose dependencies have
// ended and sends the others back to pending, and the pipeline finishes.
func TestPauseAndResumePipeline(t *testing.T) {
	onEveryStore(t, func(t *testing.T, b *pipelineBundle) {
		p := b.submit(t, pstep("a", "hold"), pstep("b", "work", "a"), pstep("c", "work", "b"))
		b.waitFor(t, p.ID, "a=running b=pending c=pending")
		rs, err := b.client.PausePipeline(b.ctx, p.ID, flotilla.Reason("maintenance"), flotilla.By("ops"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := acted(rs), "a:running->running+pause b:pending->paused c:pending->paused"; got != want {
			t.Errorf("pause acted %q, want %q", got, want)
		}
		b.waitFor(t, p.ID, "a=paused b=paused c=paused")
		rs, err = b.client.ResumePipeline(b.ctx, p.ID, flotilla.By("ops"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := acted(rs), "a:paused->queued b:paused->pending c:paused->pending"; got != want {
			t.Errorf("resume acted %q, want %q", got, want)
		}
		eventually(t, "a runs again", func() bool { return b.startedCount("a") == 2 })
		b.let("a")
		b.waitFor(t, p.ID, "a=succeeded b=succeeded c=succeeded")
		if b.startedCount("b") != 1 || b.startedCount("c") != 1 {
			t.Errorf("b started %d times, c %d, want once each", b.startedCount("b"), b.startedCount("c"))
		}
	})
}

// A running step that never checkpoints finishes despite the pause; the
// steps that depend on it stay paused until the pipeline is resumed.
func TestAPausedPipelineReleasesNothingWhenARunningStepFinishes(t *testing.T) {
	onEveryStore(t, func(t *testing.T, b *pipelineBundle) {
		p := b.submit(t, pstep("a", "deaf"), pstep("b", "work", "a"))
		b.waitFor(t, p.ID, "a=running b=pending")
		if _, err := b.client.PausePipeline(b.ctx, p.ID, flotilla.By("ops")); err != nil {
			t.Fatal(err)
		}
		b.waitFor(t, p.ID, "a=pausing b=paused")
		b.let("a")
		// b's count went to zero in the write that ended a: what that write
		// left is what b is.
		b.waitFor(t, p.ID, "a=succeeded b=paused")
		if n := b.startedCount("b"); n != 0 {
			t.Fatalf("b started %d times while its pipeline was paused", n)
		}
		rs, err := b.client.ResumePipeline(b.ctx, p.ID, flotilla.By("ops"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := acted(rs), "b:paused->queued"; got != want {
			t.Errorf("resume acted %q, want %q", got, want)
		}
		b.waitFor(t, p.ID, "a=succeeded b=succeeded")
	})
}

// TestSubmitPipelineTxFollowsTheCallersTransaction submits a pipeline in
// the caller's transaction on each store that has one: a rollback leaves
// nothing, an invalid pipeline is refused before anything is written, and
// a commit creates the pipeline and announces its first step (no node runs
// yet, so nothing else announces anything); a node started then runs it to
// its end.
func TestSubmitPipelineTxFollowsTheCallersTransaction(t *testing.T) {
	type opened struct {
		submit   func(flotilla.PipelineRequest) (store.Pipeline, error)
		commit   func() error
		rollback func() error
	}
	run := func(t *testing.T, ctx context.Context, s store.Store, c *flotilla.Client, begin func() opened) {
		sub, err := s.(store.Notifier).Listen(ctx, store.TopicTasks)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		chain := []task.Step{pstep("a", "work"), pstep("b", "work", "a")}

		tx := begin()
		if _, err := tx.submit(flotilla.PipelineRequest{Name: "undone", Key: "undone", Steps: chain}); err != nil {
			t.Fatal(err)
		}
		if err := tx.rollback(); err != nil {
			t.Fatal(err)
		}

		tx = begin()
		cycle := []task.Step{pstep("a", "work", "b"), pstep("b", "work", "a")}
		if _, err := tx.submit(flotilla.PipelineRequest{Name: "cycle", Steps: cycle}); !errors.Is(err, store.ErrInvalid) ||
			!strings.Contains(err.Error(), "cycle") {
			t.Errorf("a pipeline with a cycle: %v, want store.ErrInvalid naming the cycle", err)
		}
		if err := tx.commit(); err != nil {
			t.Fatalf("committing the caller's transaction after a refused pipeline: %v", err)
		}
		if list, err := c.List(ctx, store.TaskFilter{}); err != nil || len(list) != 0 {
			t.Fatalf("after a rollback and a refusal: %d tasks (%v), want none", len(list), err)
		}

		tx = begin()
		p, err := tx.submit(flotilla.PipelineRequest{Name: "done", Key: "done", Steps: chain})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.commit(); err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-sub.C():
			if n.Payload != bucketString(p.Bucket) {
				t.Errorf("notification %+v, want the committed pipeline's bucket %d", n, p.Bucket)
			}
		case <-time.After(patience.Scale(30 * time.Second)):
			t.Fatal("no notification of the committed pipeline")
		}
		b := newPipelineBundle(t, ctx, s, c)
		b.waitFor(t, p.ID, "a=succeeded b=succeeded")
		if list, err := c.List(ctx, store.TaskFilter{}); err != nil || len(list) != 2 {
			t.Errorf("after the commit: %d tasks (%v), want the committed pipeline's 2", len(list), err)
		}

	}
	t.Run("sqlite", func(t *testing.T) {
		ctx, s, c, db := sqliteClient(t)
		run(t, ctx, s, c, func() opened {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			submit := func(r flotilla.PipelineRequest) (store.Pipeline, error) { return c.SubmitPipelineSQLiteTx(ctx, tx, r) }
			return opened{submit: submit, commit: tx.Commit, rollback: tx.Rollback}
		})
	})
	t.Run("postgres", func(t *testing.T) {
		pb := setup(t)
		run(t, pb.ctx, pb.store, pb.client, func() opened {
			tx, err := pb.store.Pool().Begin(pb.ctx)
			if err != nil {
				t.Fatal(err)
			}
			submit := func(r flotilla.PipelineRequest) (store.Pipeline, error) {
				return pb.client.SubmitPipelineTx(pb.ctx, tx, r)
			}
			return opened{submit: submit, commit: func() error { return tx.Commit(pb.ctx) }, rollback: func() error { return tx.Rollback(pb.ctx) }}
		})
	})
	t.Run("memory", func(t *testing.T) {
		ctx := context.Background()
		_, c := memoryClient(t, ctx)
		_, err := c.SubmitPipelineSQLiteTx(ctx, nil, flotilla.PipelineRequest{Name: "x", Steps: []task.Step{pstep("a", "work")}})
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("SubmitPipelineSQLiteTx on the memory store: %v, want store.ErrInvalid", err)
		}
	})
}
