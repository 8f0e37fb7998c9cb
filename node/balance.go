package node

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/balance"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// freeGrace is how many heartbeats a free bucket this node declares may
// wait for the node the assignment gives it to before this node takes it
// anyway: a bucket never waits long for a node that does not come (its view
// lags, or it is stuck), and balance moves it later if it must.
const freeGrace = 3

// fullEvery is how many heartbeats a balancing node may go without reading
// the lease table when nothing it sees has changed: what it renews, the
// node list, the notifications. Balance reads the table when they change;
// this bounds what a change none of them shows (none should) waits.
const fullEvery = 10

// balancer runs after each bucket lease tick (DESIGN §6a). It reads the
// fleet (its live nodes with their declarations, the leases with their
// hand-offs and pins), computes the assignment every node computes
// (package balance), and acts on this node's part of it: it tells the
// keeper which free buckets to take, and starts, redirects or calls off the
// hand-offs of the buckets this node holds. Every node acting on the same
// assignment moves each bucket once, from its holder to its target; a node
// whose view lags only acts later, since only a bucket's holder gives it
// and nobody takes a bucket another node holds.
type balancer struct {
	n *Node

	// dirty is set by a notification that leases changed (a hand-off, a
	// release, a pin): the next pass reads the lease table.
	dirty atomic.Bool
	// reregister is set when Start could not register the node as
	// balancing: the next pass tries again.
	reregister atomic.Bool

	mu sync.Mutex
	// assignment is the last one computed, for Share and the metrics.
	assignment balance.Assignment
	computed   bool
	// free is when each declared bucket was first seen free, in the
	// passes that have seen it free since.
	free map[int]time.Time
	// nodes is a digest of the node list the last assignment was computed
	// from, read, with the lease table, at lastRead.
	nodes    uint64
	lastRead time.Time
}

func newBalancer(n *Node) *balancer {
	return &balancer{n: n, free: map[int]time.Time{}}
}

// view reads the fleet as the assignment needs it.
func (bl *balancer) view(ctx context.Context) ([]store.NodeInfo, []store.BucketLease, error) {
	n := bl.n
	// Bounded by a heartbeat, not a renewal's timeout: nothing waits on
	// it, and the next pass comes then anyway.
	ctx, cancel := context.WithTimeout(ctx, max(n.cfg.BucketLeaseHeartbeat, n.stmtTimeout))
	defer cancel()
	nodes, err := n.store.ListNodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	leases, err := n.store.ListBuckets(ctx)
	if err != nil {
		return nil, nil, err
	}
	return nodes, leases, nil
}

// plan computes the assignment from the fleet as it is now and sets what
// the keeper may take; it returns the assignment and the live nodes'
// incarnations by id. It reads the node list; the lease table (a row per
// bucket) only when something may have moved: the node list changed, the
// keeper's renewal saw a bucket change hands or one free, a notification
// said leases changed, or fullEvery heartbeats passed (or always, with
// force). ok is false when it read nothing new, or the fleet could not be
// read: there is nothing to act on.
func (bl *balancer) plan(ctx context.Context, force bool) (balance.Assignment, map[string]string, bool) {
	n := bl.n
	ctx, cancel := context.WithTimeout(ctx, max(n.cfg.BucketLeaseHeartbeat, n.stmtTimeout))
	defer cancel()
	nodes, err := n.store.ListNodes(ctx)
	if err != nil {
		n.log.Warn("reading the fleet to balance buckets failed; will retry at the next heartbeat", zap.Error(err))
		return balance.Assignment{}, nil, false
	}
	digest := nodesDigest(nodes)
	moved, dirty := n.keeper.movedSince(), bl.dirty.Swap(false)
	bl.mu.Lock()
	stale := n.cfg.Clock.Now().Sub(bl.lastRead) >= fullEvery*n.cfg.BucketLeaseHeartbeat
	same := digest == bl.nodes
	bl.mu.Unlock()
	if !force && same && !moved && !dirty && !stale {
		return balance.Assignment{}, nil, false
	}
	leases, err := n.store.ListBuckets(ctx)
	if err != nil {
		bl.dirty.Store(true) // read it at the next pass
		n.log.Warn("reading the fleet to balance buckets failed; will retry at the next heartbeat", zap.Error(err))
		return balance.Assignment{}, nil, false
	}
	a, incarnations := n.assign(nodes, leases)
	bl.mu.Lock()
	bl.assignment, bl.computed = a, true
	bl.nodes, bl.lastRead = digest, n.cfg.Clock.Now()
	var take []int
	seen := map[int]bool{}
	now := n.cfg.Clock.Now()
	for _, l := range leases {
		if l.Holder != "" || !n.declared.Contains(l.Bucket) {
			continue
		}
		seen[l.Bucket] = true
		if _, ok := bl.free[l.Bucket]; !ok {
			bl.free[l.Bucket] = now
		}
		if a.Target(l.Bucket) == n.id || now.Sub(bl.free[l.Bucket]) >= freeGrace*n.cfg.BucketLeaseHeartbeat {
			take = append(take, l.Bucket)
		}
	}
	for b := range bl.free {
		if !seen[b] {
			delete(bl.free, b)
		}
	}
	bl.mu.Unlock()
	if !n.cfg.NoBalance && n.keeper.setTake(bucket.Of(take...)) {
		// Free buckets are this node's: take them now, not a heartbeat
		// later.
		n.leaseLoop.poke()
	}
	return a, incarnations, true
}

// nodesDigest sums up what of the node list the assignment reads.
func nodesDigest(nodes []store.NodeInfo) uint64 {
	h := fnv.New64a()
	for _, nd := range nodes {
		fmt.Fprintf(h, "%s|%s|%t|%t|%t|%s\n", nd.ID, nd.Incarnation, nd.Alive, nd.Leaving, nd.Balance, nd.Buckets)
	}
	return h.Sum64()
}

// pass plans and acts on this node's buckets: a held bucket whose target is
// another live node is handed to it; a bucket being handed over whose
// target changed goes to the new target, or, when the target is this node
// again, is kept.
func (bl *balancer) pass(ctx context.Context) {
	n := bl.n
	if n.isDraining() {
		return // Shutdown hands the buckets on itself
	}
	if bl.reregister.Swap(false) {
		if err := n.store.RegisterNode(ctx, n.registration(regServing), n.cfg.BucketLeaseTTL); err != nil {
			bl.reregister.Store(true)
		}
	}
	a, incarnations, ok := bl.plan(ctx, false)
	if !ok {
		return
	}
	giving := n.handoffs.underWay()
	var moves []handoffMove
	for _, h := range n.keeper.holding(true) {
		target := a.Target(h.Bucket)
		_, underWay := giving[h.Bucket]
		switch {
		case target == n.id || target == "" || incarnations[target] == "":
			if underWay {
				n.handoffs.callOff(h.Bucket)
			}
		case !underWay || giving[h.Bucket] != target:
			moves = append(moves, handoffMove{bucket: h.Bucket, to: incarnations[target], toNode: target})
		}
	}
	if len(moves) > 0 {
		n.handoffs.begin(n.runCtx, moves)
	}
}

// Share returns how many buckets the fleet's assignment gives this node,
// as of its last balance pass (zero before the first).
func (n *Node) Share() int {
	n.balancer.mu.Lock()
	defer n.balancer.mu.Unlock()
	if !n.balancer.computed {
		return 0
	}
	return n.balancer.assignment.Of(n.id).Len()
}

// Handoffs returns the buckets this node is handing over now, each with its
// successor's node id, ascending.
func (n *Node) Handoffs() []BucketHandoff {
	under := n.handoffs.underWay()
	out := make([]BucketHandoff, 0, len(under))
	for b, to := range under {
		out = append(out, BucketHandoff{Bucket: b, To: to})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bucket < out[j].Bucket })
	return out
}

// BucketHandoff is a bucket this node is handing to another.
type BucketHandoff struct {
	Bucket int
	To     string // the successor's node id
}

// handOffAtShutdown starts, as Shutdown begins, the hand-off of every
// bucket this node holds to the node that the assignment without it gives
// the bucket to: each goes as soon as its own tasks are settled, through
// the same hand-off as balance's. The node first says it is leaving, so
// that no node hands it a bucket any more. A bucket no other live node
// declares is released at the end of Shutdown, as before.
func (n *Node) handOffAtShutdown(ctx context.Context) {
	n.registerLeaving(ctx)
	a, incarnations, leases, ok := n.shutdownPlan(ctx)
	if !ok {
		return
	}
	var moves []handoffMove
	for _, h := range n.keeper.holding(true) {
		target := a.Target(h.Bucket)
		if target == "" || target == n.id || incarnations[target] == "" {
			continue
		}
		moves = append(moves, handoffMove{bucket: h.Bucket, to: incarnations[target], toNode: target})
	}
	if handed := n.handoffs.begin(n.runCtx, moves); len(handed) > 0 {
		n.log.Info("shutting down: handing buckets to the nodes that declare them",
			zap.String("buckets", bucket.Of(handed...).String()))
	}
	n.handOnUntakenUp(ctx, a, incarnations, leases)
}

// shutdownPlan reads the fleet and computes the assignment without this
// node, which is leaving.
func (n *Node) shutdownPlan(ctx context.Context) (balance.Assignment, map[string]string, []store.BucketLease, bool) {
	nodes, leases, err := n.balancer.view(ctx)
	if err != nil {
		n.log.Warn("reading the fleet to hand buckets on at shutdown failed; they are released instead",
			zap.Error(err))
		return balance.Assignment{}, nil, nil, false
	}
	a, incarnations := n.assign(nodes, leases)
	return a, incarnations, leases, true
}

// assign is the fleet's assignment, with the live incarnation of each node
// it may name, for the hand-offs' successors. This node counts as what it
// is, balancing or not, even while it is registered as starting (the
// others hand it nothing then, but it takes its part of the buckets nobody
// holds).
func (n *Node) assign(nodes []store.NodeInfo, leases []store.BucketLease) (balance.Assignment, map[string]string) {
	incarnations := map[string]string{}
	nodes = slices.Clone(nodes)
	for i, nd := range nodes {
		if nd.Incarnation == n.incarnation {
			nodes[i].Balance = !n.cfg.NoBalance
		}
		if nd.Alive && !nd.Leaving {
			incarnations[nd.ID] = nd.Incarnation
		}
	}
	return balance.Assign(balance.FromStore(len(leases), nodes, leases)), incarnations
}

// handOnUntakenUp hands on, at once, the buckets other nodes handed to this
// one that it has not taken up (its keeper has not renewed them since): it
// ran nothing in them, so they need no wait; released with the rest at the
// end of Shutdown instead, they would wait for a node to take them.
func (n *Node) handOnUntakenUp(ctx context.Context, a balance.Assignment, incarnations map[string]string,
	leases []store.BucketLease) {
	known := map[int]bool{}
	for _, h := range n.keeper.holding(true) {
		known[h.Bucket] = true
	}
	var moves []store.Handoff
	for _, l := range leases {
		target := a.Target(l.Bucket)
		if l.Holder != n.incarnation || known[l.Bucket] || target == "" || target == n.id || incarnations[target] == "" {
			continue
		}
		moves = append(moves, store.Handoff{Bucket: l.Bucket, Epoch: l.Epoch, To: incarnations[target], ToNode: target})
	}
	if len(moves) == 0 {
		return
	}
	if n.handoffs.write(ctx, "handing on buckets handed to this node as it shuts down", func(ctx context.Context) error {
		_, err := n.store.HandOff(ctx, n.incarnation, moves, n.cfg.BucketLeaseTTL)
		return err
	}) {
		n.log.Info("shutting down: handed on buckets handed to this node", zap.String("buckets", describeMoves(moves)))
	}
}

// registerLeaving tells the fleet this node is leaving: the balance of the
// others leaves it out from then on.
func (n *Node) registerLeaving(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	defer cancel()
	if err := n.store.RegisterNode(ctx, n.registration(regLeaving), n.cfg.BucketLeaseTTL); err != nil {
		n.log.Warn("telling the fleet this node is leaving failed", zap.Error(err))
	}
}

// finishHandoffs waits, once Shutdown has written every outcome, for the
// hand-offs under way to end; when ctx ends first, it calls those left off,
// and their buckets are released (or left to lapse) with the rest.
func (n *Node) finishHandoffs(ctx context.Context) {
	// Nodes that had not yet seen this one leaving may have handed it
	// buckets meanwhile.
	if a, incarnations, leases, ok := n.shutdownPlan(ctx); ok {
		n.handOnUntakenUp(ctx, a, incarnations, leases)
	}
	if !n.handoffs.wait(ctx) {
		n.log.Warn("shutdown deadline passed with bucket hand-offs under way; calling them off")
		n.handoffs.callOffAll()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		n.handoffs.wait(wctx)
	}
	n.handoffs.loop.stop()
}
