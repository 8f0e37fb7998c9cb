package node

import (
	"context"
	"time"

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
	for ctx.Err() == nil && n.claimOnce(ctx) {
	}
}

// claimOnce sends one claim for the node's free slots and starts what it
// took; it reports whether the claim filled every slot it asked for.
func (n *Node) claimOnce(ctx context.Context) (full bool) {
	h := n.holdClaims()
	defer h.release()
	n.recoverLostClaims(ctx)
	free := min(n.capacity(), maxClaimBatch)
	if free <= 0 {
		return false
	}
	held := n.keeper.Held()
	if len(held) == 0 || len(n.kinds) == 0 {
		return false
	}
	cctx, cancel := n.claimContext(ctx)
	// The task leases start in the database after this moment, so the
	// attempts' local deadlines count from it.
	sent := n.cfg.Clock.Now()
	req := n.claimRequest(held, free)
	var claimed []*task.Task
	var err error
	if n.limits.active() {
		claimed, err = n.claimLimited(cctx, req, held)
	} else {
		claimed, err = n.store.ClaimTasks(cctx, req)
	}
	cancel()
	n.metrics.Claimed(claimed, n.cfg.Clock.Now().Sub(sent), err)
	if err != nil {
		n.log.Warn("claiming tasks failed; will retry", zap.Int("limit", free), zap.Error(err))
		n.claimFailed(err)
		n.recoverLostClaims(ctx)
		return false
	}
	for _, t := range claimed {
		h.prepare(t, sent)
	}
	return len(claimed) >= free
}

// claimContext is the context of a claim's statement. The statement is not
// cut by a stop: tasks the store may have claimed must reach the running
// set, to be run or released. For the same reason the client waits twice
// as long as the statement may run: the store has the database enforce
// half the deadline, so a slow claim is rolled back there rather than
// committed behind a client that has stopped listening.
func (n *Node) claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*n.stmtTimeout)
}

// claimHold is one claimer's hold of claimMu: what it claimed is prepared
// (registered against the node's slots) while it holds it, and executed
// once it has let go.
type claimHold struct {
	n        *Node
	prepared []*attempt
}

func (n *Node) holdClaims() *claimHold {
	n.claimMu.Lock()
	return &claimHold{n: n}
}

// tryHoldClaims is holdClaims unless another claimer holds claimMu.
func (n *Node) tryHoldClaims() (*claimHold, bool) {
	if !n.claimMu.TryLock() {
		return nil, false
	}
	return &claimHold{n: n}, true
}

func (h *claimHold) prepare(t *task.Task, sent time.Time) {
	h.prepared = append(h.prepared, h.n.prepare(t, sent))
}

func (h *claimHold) release() {
	h.n.claimMu.Unlock()
	for _, a := range h.prepared {
		h.n.execute(a)
	}
}

// claimRequest asks for up to free tasks of the node's kinds in held.
func (n *Node) claimRequest(held []store.HeldBucket, free int) store.ClaimRequest {
	return store.ClaimRequest{
		Owner:    n.incarnation,
		Node:     n.id,
		Buckets:  held,
		Kinds:    n.kinds,
		Limit:    free,
		LeaseTTL: n.cfg.TaskLeaseTTL,
	}
}

// claimLimited is the claim of a node with limits: the holder's view
// decides which keys, kinds and resources have room, and the store takes
// only those. When every kind the node serves is under a fleet-wide limit,
// the claim asks for no more than the kinds' rooms, and a node whose shares
// are spent sends no claim at all: the store would take nothing, and a
// smaller claim looks at fewer candidates.
func (n *Node) claimLimited(ctx context.Context, req store.ClaimRequest, held []store.HeldBucket) ([]*task.Task, error) {
	n.limits.shareGate.Lock()
	defer n.limits.shareGate.Unlock()
	req, lc := n.limitedRequest(req, held, nil)
	var claimed []*task.Task
	var err error
	if len(req.Buckets) > 0 && req.Limit > 0 {
		claimed, err = n.store.ClaimLimited(ctx, req, lc)
	}
	n.limits.hold(claimed)
	n.limits.opened(claimed)
	return claimed, err
}

// limitedRequest narrows req to what the limiter leaves room for, as if
// the attempts ending had already freed what they hold (their outcomes are
// written first, in the same transaction). The caller holds shareGate.
func (n *Node) limitedRequest(req store.ClaimRequest, held []store.HeldBucket, ending []task.Ref) (store.ClaimRequest, store.LimitedClaim) {
	var lc store.LimitedClaim
	req.Buckets, lc = n.limits.claim(held, ending)
	if room, bounded := kindsRoom(lc, n.kinds); bounded {
		req.Limit = min(req.Limit, room)
	}
	for i, kr := range lc.Kinds {
		if kr.Room == 0 {
			// Its share is spent: ask again for one before the heartbeat.
			n.limits.shareWanted.Store(true)
		}
		if kr.Room >= req.Limit && req.Limit > 0 {
			// A room the claim cannot fill turns no candidate down, so it
			// is no room for this claim: a claim whose first candidates
			// then decide it skips its ranking (under a fleet-wide limit
			// that is every claim of a slot an outcome frees).
			lc.Kinds[i].Room = -1
		}
	}
	return req, lc
}

// flushAndClaim writes a batch of outcomes of a node under a fleet-wide
// limit and, in the same transaction, claims what the slots they free may
// start, so that a slot of the fleet's quota waits for one write instead
// of an outcome write and then a claim (see Store.AdvanceAndClaimLimited).
// It reports whether the outcomes were written; when it does not, the
// completer writes them alone, and the claim loop, poked once they are
// settled, claims.
//
// Under per-key limits alone it writes nothing: the claims along with the
// writes took few tasks each, and a burn-down of 10,000 keys limited to 1
// ran about a tenth faster without them (docs/benchmarks.md).
//
// It claims along only when no claim pass is in flight, since both count
// the same free slots: under a backlog the claim loop is busy and the
// outcomes are written beside its claims, as without limits (waiting for
// the pass instead put every write behind a claim, and the burn-down of
// 10,000 keys limited to 1 fell from 0.58 to 0.45 of the unlimited one).
// It claims along when the slots and the limiter leave room and the batch
// can go in one statement, and never once the node stops.
func (n *Node) flushAndClaim(ctx context.Context, batch []completion) bool {
	if !n.limits.fleetWide.Load() || ctx.Err() != nil || n.isDraining() {
		return false // per-key limits alone, or a node that stops: no claim along
	}
	h, ok := n.tryHoldClaims()
	if !ok {
		return false
	}
	defer h.release()
	registered, active, _ := n.attempts.counts()
	free := min(n.cfg.Concurrency-active, 2*n.cfg.Concurrency-(registered-len(batch)), maxClaimBatch)
	held := n.keeper.Held()
	trs := transitions(batch)
	if free <= 0 || len(held) == 0 || len(n.kinds) == 0 || store.CheckOneWrite(trs) != nil {
		return false
	}
	// A handler given up after a stop's grace may still run: what it holds
	// is not freed by its outcome, and the claim must not count it free.
	ending := make([]task.Ref, 0, len(batch))
	for _, cp := range batch {
		if done, _ := cp.a.state(); done {
			ending = append(ending, cp.a.ref)
		}
	}
	n.limits.shareGate.Lock()
	req, lc := n.limitedRequest(n.claimRequest(held, free), held, ending)
	if len(req.Buckets) == 0 || req.Limit <= 0 {
		n.limits.shareGate.Unlock()
		return false
	}
	wctx, cancel := n.claimContext(ctx)
	sent := n.cfg.Clock.Now()
	outcomes, claimed, err := n.store.AdvanceAndClaimLimited(wctx, n.incarnation, trs, req, lc)
	cancel()
	took := n.cfg.Clock.Now().Sub(sent)
	if outcomes == nil {
		for i := range batch {
			batch[i].unsure = true // the statement may have committed
		}
		n.limits.shareGate.Unlock()
		n.log.Warn("recording task outcomes with a claim failed; recording them alone",
			zap.Int("tasks", len(batch)), zap.Error(err))
		n.claimFailed(err)
		return false
	}
	n.limits.hold(claimed)
	n.limits.opened(claimed)
	for _, t := range claimed {
		h.prepare(t, sent)
	}
	n.limits.shareGate.Unlock()
	n.metrics.Claimed(claimed, took, err)
	if err != nil {
		n.log.Warn("claiming tasks with an outcome write failed; will retry", zap.Int("limit", req.Limit), zap.Error(err))
		n.claimFailed(err)
	}
	n.confirmUnsure(ctx, batch, outcomes)
	n.metrics.Flushed(n.finished(batch, outcomes), took, nil)
	n.written(batch, outcomes)
	return true
}

// kindsRoom sums the rooms lc gives the kinds; bounded is false when one of
// them has no room of its own (no fleet-wide limit).
func kindsRoom(lc store.LimitedClaim, kinds []string) (room int, bounded bool) {
	rooms := make(map[string]int, len(lc.Kinds))
	for _, kr := range lc.Kinds {
		rooms[kr.Kind] = kr.Room
	}
	for _, kind := range kinds {
		r, ok := rooms[kind]
		if !ok || r < 0 {
			return 0, false
		}
		room += r
	}
	return room, true
}
