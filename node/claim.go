package node

import (
	"context"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// maxClaimBatch bounds one claim statement, whatever the concurrency.
const maxClaimBatch = 1000

// capacity is how many more attempts the node can start now: at most
// Concurrency handlers run at once, and at most Concurrency attempts whose
// handler has returned wait beside them for their outcome to be written.
//
// Counting the waiting outcomes in full against Concurrency would halve the
// claim batches under a backlog of short tasks: with 100 slots, claims of
// about 37 tasks would run while as many outcomes were being written and as
// many more waited for the next write, and the database's fixed cost per
// statement (planning, commit) would dominate, at three times the database
// CPU per task of claims of 1,000. The allowance keeps the claims about as
// large as the handlers allow, while still bounding what a node holds when
// its writes fall behind (a slow or unreachable database) to twice
// Concurrency.
func (n *Node) capacity() int {
	registered, active, _ := n.attempts.counts()
	return min(n.cfg.Concurrency-active, 2*n.cfg.Concurrency-registered)
}

// claimPass claims and starts as many tasks as the node can start now.
//
// The claim loop runs it when a notification announces work in a held
// bucket, when an attempt is settled (a slot is free), when a bucket is
// acquired, and every PollInterval otherwise. A batch that fills every free
// slot means there may be more: the pass claims again at once, so a backlog
// burns down at the speed of the handlers, not of the poll interval.
//
// Invariant 1: it names only the buckets the keeper holds now, each with
// its epoch, and the store takes a task only from a bucket whose lease this
// incarnation holds under that epoch.
func (n *Node) claimPass(ctx context.Context) {
	defer n.claimPasses.Add(1)
	for ctx.Err() == nil {
		free := min(n.capacity(), maxClaimBatch)
		if free <= 0 {
			return
		}
		held := n.keeper.Held()
		if len(held) == 0 || len(n.kinds) == 0 {
			return
		}
		// The statement is not cut by a stop: tasks the store may have
		// claimed must reach the running set, to be run or released. For the
		// same reason the client waits twice as long as the statement may
		// run: the store has the database enforce half the deadline, so a
		// slow claim is rolled back there rather than committed behind a
		// client that has stopped listening.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*n.stmtTimeout)
		// The task leases start in the database after this moment, so the
		// attempts' local deadlines count from it.
		sent := n.cfg.Clock.Now()
		req := store.ClaimRequest{
			Owner:    n.incarnation,
			Node:     n.id,
			Buckets:  held,
			Kinds:    n.kinds,
			Limit:    free,
			LeaseTTL: n.cfg.TaskLeaseTTL,
		}
		var claimed []*task.Task
		var err error
		limited := n.limits.active()
		if limited {
			// The holder's view decides which keys, kinds and resources
			// have room; the store takes only those.
			var lc store.LimitedClaim
			req.Buckets, lc = n.limits.claim(held)
			if len(req.Buckets) > 0 {
				claimed, err = n.store.ClaimLimited(cctx, req, lc)
			}
		} else {
			claimed, err = n.store.ClaimTasks(cctx, req)
		}
		cancel()
		if limited {
			n.limits.hold(claimed)
			n.limits.opened(claimed)
		}
		n.metrics.Claimed(claimed, n.cfg.Clock.Now().Sub(sent), err)
		if err != nil {
			n.log.Warn("claiming tasks failed; will retry", zap.Int("limit", free), zap.Error(err))
			return
		}
		for _, t := range claimed {
			n.launch(t, sent)
		}
		if len(claimed) < free {
			return
		}
	}
}
