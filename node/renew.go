package node

import (
	"context"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/task"
)

// renewTaskLeases extends, in one statement, the task lease of every
// attempt this node has not settled: those still running and those whose
// outcome waits to be written. An attempt missing from the answer is no
// longer this node's to finish (its bucket's epoch moved on, or it was
// rescued): its handler is cancelled and nothing is written for it.
//
// A failed call changes nothing: the leases run for TaskLeaseTTL, three
// renewal periods, and a database that stays away long enough costs the
// node its bucket leases first, which cancels the handlers anyway.
func (n *Node) renewTaskLeases(ctx context.Context) {
	n.mu.Lock()
	refs := make([]task.Ref, 0, len(n.running))
	for ref, a := range n.running {
		if a.abandoned == nil {
			refs = append(refs, ref)
		}
	}
	n.mu.Unlock()
	if len(refs) == 0 {
		return
	}

	rctx, cancel := context.WithTimeout(ctx, n.stmtTimeout)
	renewed, err := n.store.RenewTaskLeases(rctx, n.incarnation, refs, n.cfg.TaskLeaseTTL)
	cancel()
	if err != nil {
		n.log.Warn("renewing task leases failed; will retry", zap.Int("tasks", len(refs)), zap.Error(err))
		return
	}
	if len(renewed) == len(refs) {
		return
	}
	ok := make(map[task.Ref]bool, len(renewed))
	for _, r := range renewed {
		ok[r] = true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ref := range refs {
		if a := n.running[ref]; a != nil && !ok[ref] {
			// A settled attempt may be missing because its outcome was
			// written meanwhile; abandonLocked leaves it alone.
			n.abandonLocked(a, ErrTaskLeaseLost)
		}
	}
}
