package node

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A claim statement can commit and still fail on the node: the connection
// closes before its answer comes (the primary lost in a failover, a proxy
// restarted), or the node stops waiting for an answer that the database
// sends later. Its tasks are then running under this incarnation with no
// handler here. Left alone, nothing renews their task leases and the rescue
// takes them once the leases expire, a task lease TTL later, with the
// attempt counted as a failure. A node whose claim failed reads them back
// instead, and releases each to queued, the attempt not counted, as at a
// graceful shutdown; the claim loop then takes them again.
//
// A claim whose statement commits after the read-back (an answer the node
// stopped waiting for while the database still ran it) is not found by it:
// the rescue is what remains for those.

// reasonLostClaim is the audit reason of such a release.
const reasonLostClaim = "released: the answer of the claim that took it was lost"

// claimFailed notes that a claim statement failed and may have committed:
// the next claim pass reads back what it may have taken.
func (n *Node) claimFailed(err error) {
	if errors.Is(err, store.ErrInvalid) {
		return // refused before anything was written
	}
	n.lostClaims.Store(true)
}

// releaseLostClaims releases the tasks running under this incarnation, in
// the buckets it holds, that no attempt of this node took: the tasks of a
// claim whose answer was lost. It runs under claimMu, where every task a
// claimer took is registered, so a running task of this incarnation that is
// not registered is one no handler here will run. Each release is
// conditional on the task's claim_seq and the bucket's epoch, like any
// outcome write. It reports whether it read and released what it had to;
// otherwise the next claim pass tries again.
func (n *Node) releaseLostClaims(ctx context.Context) bool {
	held := n.keeper.Held()
	if len(held) == 0 {
		// The buckets' next holders rescue whatever is left in them.
		return true
	}
	bs := make([]int, len(held))
	for i, h := range held {
		bs[i] = h.Bucket
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	defer cancel()
	// The active rows of the held buckets, read through the index that
	// holds only those: a node's own, and its claims lost, are among them.
	active, err := n.store.ActiveUse(rctx, bs)
	if err != nil {
		n.log.Warn("reading back the tasks of a failed claim failed; will retry", zap.Error(err))
		return false
	}
	var release []store.ActiveTransition
	var ids []int64
	for _, u := range active {
		ref := task.Ref{ID: u.ID, ClaimSeq: u.ClaimSeq}
		if u.Owner != n.incarnation || n.attempts.has(ref) {
			continue
		}
		release = append(release, store.ActiveTransition{Ref: ref, To: task.Queued, Reason: reasonLostClaim, Node: n.id})
		ids = append(ids, u.ID)
	}
	if len(release) == 0 {
		return true
	}
	if _, err := n.store.AdvanceActive(rctx, n.incarnation, release); err != nil {
		n.log.Warn("releasing the tasks of a claim whose answer was lost failed; will retry",
			zap.Int64s("tasks", ids), zap.Error(err))
		return false
	}
	n.log.Warn("released the tasks of a claim whose answer was lost; they are claimed again",
		zap.Int64s("tasks", ids))
	n.claimLoop.poke()
	return true
}

// recoverLostClaims runs releaseLostClaims when a claim has failed since the
// last read-back. The caller holds claimMu.
func (n *Node) recoverLostClaims(ctx context.Context) {
	if n.lostClaims.Load() && n.releaseLostClaims(ctx) {
		n.lostClaims.Store(false)
	}
}
