package node

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// lostClaimAnswers commits the first claim that takes tasks and answers it
// with an error, as a connection cut after its commit does (the primary's
// loss in a failover, a proxy that closes the connection): the tasks are
// running under the node, which never saw them.
type lostClaimAnswers struct {
	store.Store
	lost atomic.Int64 // the tasks of the claim whose answer was lost
}

var errAnswerLost = errors.New("unexpected EOF: the connection closed before the claim's answer came")

func (s *lostClaimAnswers) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	claimed, err := s.Store.ClaimTasks(ctx, req)
	if err == nil && len(claimed) > 0 && s.lost.CompareAndSwap(0, int64(len(claimed))) {
		return nil, errAnswerLost
	}
	return claimed, err
}

// A claim whose answer is lost after its commit leaves its tasks running
// under the node with no handler. The node reads them back and releases
// them at once, the attempt not counted, rather than leave them to the
// rescue a task lease later (an hour here), and runs them.
func TestTheTasksOfAClaimWhoseAnswerWasLostAreReleasedAtOnce(t *testing.T) {
	b := setup(t, withManualClock())
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &lostClaimAnswers{Store: h}
	cfg := b.config(t, "cut")
	cfg.TaskLeaseTTL, cfg.ReconcileInterval = time.Hour, time.Hour
	cfg, logs := observed(cfg)
	ran := make(chan int, 4)
	n := newNodeOn(t, s, cfg, map[string]Handler{
		"work": func(_ context.Context, tk *task.Task) error { ran <- tk.Attempt; return nil },
	})
	created, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "work", Key: "k", Bucket: b.policy.Of("k")}})
	if err != nil {
		t.Fatal(err)
	}
	id := created[0].ID
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the task succeeded with the clock standing still", b.statusIs(t, id, task.Succeeded))
	if got := s.lost.Load(); got != 1 {
		t.Fatalf("%d tasks in the claim whose answer was lost, want 1", got)
	}
	if got := receive(t, ran, "the handler's run"); got != 1 {
		t.Errorf("the handler ran attempt %d, want 1: the release must not count the attempt", got)
	}
	select {
	case again := <-ran:
		t.Errorf("the handler ran a second time (attempt %d)", again)
	default:
	}
	if trail := b.trail(t, id); trail != "queued running queued running succeeded" {
		t.Errorf("trail %q, want the lost claim released to queued and claimed again", trail)
	}
	if entries := logs.FilterMessageSnippet("released the tasks of a claim whose answer was lost").AllUntimed(); len(entries) != 1 {
		t.Errorf("%d log lines about the release, want 1", len(entries))
	}
}

// lostOutcomeAnswers commits the first outcome write and answers it with an
// error, as a connection cut after the commit does.
type lostOutcomeAnswers struct {
	store.Store
	lost atomic.Bool
}

func (s *lostOutcomeAnswers) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	out, err := s.Store.AdvanceActive(ctx, owner, batch)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return nil, errAnswerLost
	}
	return out, err
}

// An outcome write whose answer is lost after its commit is written again,
// and fenced by its claim_seq: the node reads the task's trail back and
// finds its own move there, so the outcome counts as recorded, not fenced.
func TestAnOutcomeWhoseAnswerWasLostIsConfirmedFromTheTrail(t *testing.T) {
	b := setup(t)
	h := b.store.Handle()
	t.Cleanup(h.Close)
	s := &lostOutcomeAnswers{Store: h}
	cfg, logs := observed(b.config(t, "cut"))
	metrics := &recordingMetrics{}
	cfg.Metrics = metrics
	n := newNodeOn(t, s, cfg, map[string]Handler{
		"work": func(context.Context, *task.Task) error { return nil },
	})
	created, err := b.store.CreateTasks(b.ctx, []store.NewTask{{Kind: "work", Key: "k", Bucket: b.policy.Of("k")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the outcome's second write was answered", func() bool {
		return len(logs.FilterMessageSnippet("outcome recorded by an earlier write").AllUntimed()) > 0 ||
			len(logs.FilterMessageSnippet("fenced").AllUntimed()) > 0
	})
	if !s.lost.Load() {
		t.Fatal("no outcome write's answer was lost")
	}
	if got := b.get(t, created[0].ID).Status; got != task.Succeeded {
		t.Fatalf("task %s, want succeeded", got)
	}
	if fenced := logs.FilterMessageSnippet("fenced").AllUntimed(); len(fenced) != 0 {
		t.Errorf("the outcome was logged fenced: %v", fenced[0].Message)
	}
	if got := len(logs.FilterMessageSnippet("outcome recorded by an earlier write whose answer was lost").AllUntimed()); got != 1 {
		t.Errorf("%d log lines confirming the outcome, want 1", got)
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if len(metrics.finished) != 1 || metrics.finished[0].Fenced || metrics.finished[0].To != task.Succeeded {
		t.Errorf("metrics counted %+v, want one attempt succeeded, not fenced", metrics.finished)
	}
}
