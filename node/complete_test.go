package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// gatedStore holds its first AdvanceActive until the gate opens, as a slow
// database does, and records the size of every batch.
type gatedStore struct {
	*memory.Store
	gate chan struct{}

	mu      sync.Mutex
	batches []int
}

func (g *gatedStore) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	g.enter(batch)
	return g.Store.AdvanceActive(ctx, owner, batch)
}

func (g *gatedStore) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	g.enter(batch)
	return g.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
}

// enter records a write's batch and holds the first until the gate opens.
func (g *gatedStore) enter(batch []store.ActiveTransition) {
	g.mu.Lock()
	first := len(g.batches) == 0
	g.batches = append(g.batches, len(batch))
	g.mu.Unlock()
	if first {
		<-g.gate
	}
}

func (g *gatedStore) sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.batches)
}

// A lone outcome is written at once; outcomes that arrive while a write is
// in flight go together in the next one.
func TestOutcomesThatPileUpDuringAWriteGoInOneBatch(t *testing.T) {
	b := setup(t)
	gs := &gatedStore{Store: b.store.Handle(), gate: make(chan struct{})}
	t.Cleanup(gs.Close)
	n, err := New(gs, b.config(t, "batcher"))
	if err != nil {
		t.Fatal(err)
	}
	n.Register("work", noop)
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })

	submit(t, n, SubmitRequest{Kind: "work", Key: "first"})
	eventually(t, "the lone outcome is being written", func() bool { return len(gs.sizes()) == 1 })

	reqs := make([]SubmitRequest, 9)
	for i := range reqs {
		reqs[i] = SubmitRequest{Kind: "work", Key: fmt.Sprintf("k%d", i)}
	}
	if _, err := n.SubmitMany(b.ctx, reqs); err != nil {
		t.Fatal(err)
	}
	eventually(t, "nine outcomes queued behind the write", func() bool {
		n.completer.mu.Lock()
		defer n.completer.mu.Unlock()
		return len(n.completer.queue) == 9
	})
	close(gs.gate)
	eventually(t, "all ten succeeded", func() bool { return b.countByStatus(t)[task.Succeeded] == 10 })
	if got := gs.sizes(); !slices.Equal(got, []int{1, 9}) {
		t.Errorf("batches %v, want [1 9]", got)
	}
}
