package node

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
)

// ErrHandingOff is the cause of a handler's context cancellation when the
// node hands the task's bucket to another node and the handler has not
// returned within Config.HandoffTimeout: the task is released to queued,
// its attempt not counted, and its bucket's next holder runs it.
var ErrHandingOff = errors.New("the task's bucket is handed to another node: the task is released for its next holder")

// errHandedOff ends the context of a lease handed to another node. It is a
// lost bucket to whatever still derives from it.
var errHandedOff = fmt.Errorf("%w (handed to another node)", ErrBucketLost)

// Hand-off outcomes, for HandoffMetrics.
const (
	HandoffDone      = "handed"     // the bucket went to its successor
	HandoffCalledOff = "called_off" // the assignment kept it here after all
	HandoffLost      = "lost"       // the lease was lost first
)

// HandoffMetrics is what a Metrics may also implement to follow the
// hand-offs: the node calls it when a hand-off of one of its buckets ends,
// with its outcome (HandoffDone, HandoffCalledOff, HandoffLost) and how
// long it took from its start. It must not block.
type HandoffMetrics interface {
	HandoffEnded(outcome string, took time.Duration)
}

// handoffs are the hand-offs of this node's buckets under way (DESIGN §6a),
// driven by one loop:
//
//  1. begin: the buckets are served no more (leaseKeeper.give): no claim,
//     schedule, rescue or prune there; their successors are marked in the
//     store in one statement, so that the fleet counts them as the
//     successors' already;
//  2. once every claim that could have named a bucket has registered its
//     attempts (claimMu), the loop waits until the bucket's attempts are
//     settled: their handlers have returned and their outcomes are written.
//     At HandoffTimeout it cancels those still running (ErrHandingOff),
//     whose tasks are then released to queued, no attempt counted;
//  3. the buckets whose attempts are settled are given to their successors
//     under the next epoch, in one statement (Store.HandOff), which the
//     store announces: each successor takes its buckets up at once, and no
//     write of this node under an old epoch can land.
//
// Each bucket moves as soon as its own tasks are settled, whatever the
// others wait for; the buckets ready together move in one statement, so
// that a node handing over many buckets sends few statements, on the
// connections its lease renewals use too. A hand-off is called off when the
// assignment keeps the bucket here after all, and ends when the lease is
// lost first (the ordinary takeover then follows). A node that dies in the
// middle leaves an ordinary lease to lapse.
type handoffs struct {
	n    *Node
	loop *loop

	mu sync.Mutex
	// byBucket are the hand-offs under way.
	byBucket map[int]*handoff
	// changed is closed and replaced whenever one ends, for wait.
	changed chan struct{}
}

type handoff struct {
	bucket   int
	epoch    int64
	started  time.Time
	deadline time.Time // started + HandoffTimeout: its handlers are cancelled then
	// leaseCtx ends with the lease under epoch: a lost bucket ends the
	// hand-off.
	leaseCtx context.Context

	to, toNode string // the successor's incarnation and node id
	// counted is set once every claim that could have named the bucket
	// has registered its attempts (begin's hold of claimMu): until then
	// the bucket's attempts are not all counted, and the loop leaves it.
	counted   bool
	calledOff bool
	cancelled bool // its handlers were cancelled at the deadline
}

func newHandoffs(n *Node) *handoffs {
	return &handoffs{n: n, loop: newLoop("bucket hand-off"), byBucket: map[int]*handoff{}, changed: make(chan struct{})}
}

// handoffMove is a bucket to hand to a node.
type handoffMove struct {
	bucket     int
	to, toNode string
}

// begin hands the buckets of moves over, or, for a bucket already under
// way, sends it to the node named instead; it returns the buckets under way
// afterwards.
func (hs *handoffs) begin(ctx context.Context, moves []handoffMove) []int {
	n := hs.n
	var marks []store.Handoff
	var started []int
	var fresh []*handoff
	hs.mu.Lock()
	for _, m := range moves {
		if h := hs.byBucket[m.bucket]; h != nil {
			if h.to != m.to && !h.calledOff {
				h.to, h.toNode = m.to, m.toNode
				marks = append(marks, store.Handoff{Bucket: m.bucket, Epoch: h.epoch, To: m.to, ToNode: m.toNode})
			}
			started = append(started, m.bucket)
			continue
		}
		epoch, leaseCtx, ok := n.keeper.give(m.bucket)
		if !ok {
			continue
		}
		now := n.cfg.Clock.Now()
		h := &handoff{bucket: m.bucket, epoch: epoch, started: now,
			deadline: now.Add(n.cfg.HandoffTimeout), leaseCtx: leaseCtx, to: m.to, toNode: m.toNode}
		hs.byBucket[m.bucket] = h
		fresh = append(fresh, h)
		marks = append(marks, store.Handoff{Bucket: m.bucket, Epoch: epoch, To: m.to, ToNode: m.toNode})
		started = append(started, m.bucket)
	}
	hs.mu.Unlock()
	if len(marks) == 0 {
		return started
	}
	n.log.Info("handing buckets over: no more claims there; each moves once its running tasks are settled",
		zap.String("buckets", describeMoves(marks)), zap.Duration("timeout", n.cfg.HandoffTimeout))
	// A claim pass that read the held buckets before they were given
	// registers what it claimed there before it lets go of claimMu: once
	// this hold is had, every attempt of the buckets is registered, and the
	// loop may count them.
	n.holdClaims().release()
	// Only now may the loop count the buckets' attempts: a pass that ran
	// before this hold (woken by another attempt's end) saw none of a
	// claim still in flight, and gave the bucket while that claim's tasks
	// were about to start; their outcomes were then fenced, and the
	// successor ran them again.
	hs.mu.Lock()
	for _, h := range fresh {
		h.counted = true
	}
	hs.mu.Unlock()
	hs.loop.poke()
	// The marks tell the fleet; the hand-offs do not wait for them (a mark
	// that comes after its hand-off changes nothing: its lease moved on).
	hs.write(ctx, "recording the hand-offs", func(ctx context.Context) error {
		_, err := n.store.MarkHandoff(ctx, n.incarnation, marks)
		return err
	})
	return started
}

// describeMoves groups buckets by successor: "0-7 to n2, 9 to n3".
func describeMoves(moves []store.Handoff) string {
	byNode := map[string][]int{}
	for _, m := range moves {
		byNode[m.ToNode] = append(byNode[m.ToNode], m.Bucket)
	}
	return describeStandby(invert(byNode))
}

func invert(byNode map[string][]int) map[int]string {
	out := map[int]string{}
	for node, bs := range byNode {
		for _, b := range bs {
			out[b] = node
		}
	}
	return out
}

// callOff ends the hand-off of bucket b, if one is under way and the bucket
// not yet given: the node serves it again.
func (hs *handoffs) callOff(b int) {
	hs.mu.Lock()
	if h := hs.byBucket[b]; h != nil {
		h.calledOff = true
	}
	hs.mu.Unlock()
	hs.loop.poke()
}

// underWay returns the successor's node id of each hand-off under way, by
// bucket.
func (hs *handoffs) underWay() map[int]string {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make(map[int]string, len(hs.byBucket))
	for b, h := range hs.byBucket {
		out[b] = h.toNode
	}
	return out
}

// wait waits until no hand-off is under way, or ctx ends; it reports
// whether none is.
func (hs *handoffs) wait(ctx context.Context) bool {
	for {
		hs.mu.Lock()
		left, changed := len(hs.byBucket), hs.changed
		hs.mu.Unlock()
		if left == 0 {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// callOffAll calls every hand-off under way off.
func (hs *handoffs) callOffAll() {
	hs.mu.Lock()
	for _, h := range hs.byBucket {
		h.calledOff = true
	}
	hs.mu.Unlock()
	hs.loop.poke()
}

// run is the loop: it ends the hand-offs called off or lost, cancels the
// handlers of those past their deadline, and gives the buckets whose
// attempts are settled, until ctx ends.
func (hs *handoffs) run(ctx context.Context) {
	n := hs.n
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		_, _, changed := n.attempts.counts()
		next, retry := hs.pass(ctx)
		if timer != nil {
			timer.Stop()
			timer = nil
		}
		wait := time.Duration(0)
		switch {
		case retry:
			wait = max(n.cfg.BucketLeaseHeartbeat/4, 10*time.Millisecond)
		case !next.IsZero():
			wait = max(next.Sub(n.cfg.Clock.Now()), 0)
		}
		if wait > 0 {
			timer = n.cfg.Clock.AfterFunc(wait, hs.loop.poke)
		}
		select {
		case <-ctx.Done():
			return
		case <-hs.loop.wake:
		case <-changed:
		}
	}
}

// pass does what can be done now. It returns the earliest deadline still
// ahead, and whether a hand-off statement failed and must be tried again.
func (hs *handoffs) pass(ctx context.Context) (next time.Time, retry bool) {
	n := hs.n
	now := n.cfg.Clock.Now()
	var (
		ready, off []*handoff
		cancelled  []int
	)
	hs.mu.Lock()
	for _, h := range hs.byBucket {
		switch {
		case errors.Is(context.Cause(h.leaseCtx), errHandedOff):
			// A renewal found it at its successor before the hand-off's
			// own answer came (a statement whose answer was lost).
			hs.endLocked(h, HandoffDone)
			continue
		case h.leaseCtx.Err() != nil:
			hs.endLocked(h, HandoffLost)
			n.log.Warn("bucket lease lost during its hand-off", zap.Int("bucket", h.bucket), zap.Int64("epoch", h.epoch))
			continue
		case h.calledOff:
			off = append(off, h)
			continue
		case !h.counted:
			continue // begin has not yet held the claims
		}
		if left, _ := n.attempts.inBucket(h.bucket); left == 0 {
			ready = append(ready, h)
			continue
		}
		if !now.Before(h.deadline) {
			if !h.cancelled {
				h.cancelled = true
				for _, a := range n.attempts.cancelBucket(h.bucket, ErrHandingOff) {
					cancelled = append(cancelled, int(a.ref.ID))
				}
			}
			continue
		}
		if next.IsZero() || h.deadline.Before(next) {
			next = h.deadline
		}
	}
	hs.mu.Unlock()
	if len(cancelled) > 0 {
		sort.Ints(cancelled)
		n.log.Warn("hand-off timeout passed: cancelled the handlers still running in the buckets handed over; "+
			"their tasks are released for the next holder", zap.Ints("tasks", cancelled))
	}
	hs.keep(ctx, off)
	if len(ready) > 0 && !hs.give(ctx, ready) {
		retry = true
	}
	return next, retry
}

// give hands the ready buckets over in one statement. It reports false
// when the statement failed: they are tried again.
func (hs *handoffs) give(ctx context.Context, ready []*handoff) bool {
	n := hs.n
	moves := make([]store.Handoff, len(ready))
	for i, h := range ready {
		moves[i] = store.Handoff{Bucket: h.bucket, Epoch: h.epoch, To: h.to, ToNode: h.toNode}
	}
	var handed []store.BucketLease
	ok := hs.write(ctx, "handing buckets over", func(ctx context.Context) error {
		var err error
		handed, err = n.store.HandOff(ctx, n.incarnation, moves, n.cfg.BucketLeaseTTL)
		return err
	})
	if !ok {
		return false
	}
	epochs := map[int]int64{}
	for _, l := range handed {
		epochs[l.Bucket] = l.Epoch
	}
	var done, gone []int
	hs.mu.Lock()
	for _, h := range ready {
		// Handed, or not held any more: either way this node no longer
		// holds the bucket.
		n.keeper.handedOff(h.bucket, h.epoch)
		if _, ok := epochs[h.bucket]; ok {
			hs.endLocked(h, HandoffDone)
			done = append(done, h.bucket)
		} else {
			hs.endLocked(h, HandoffLost)
			gone = append(gone, h.bucket)
		}
	}
	hs.mu.Unlock()
	if len(done) > 0 {
		handedMoves := make([]store.Handoff, 0, len(done))
		for _, m := range moves {
			if _, ok := epochs[m.Bucket]; ok {
				handedMoves = append(handedMoves, m)
			}
		}
		n.log.Info("buckets handed over under their next epoch", zap.String("buckets", describeMoves(handedMoves)))
	}
	if len(gone) > 0 {
		n.log.Warn("buckets not handed over: this node no longer held them", zap.String("buckets", bucket.Of(gone...).String()))
	}
	return true
}

// keep serves the buckets of hand-offs called off again, and clears their
// marks.
func (hs *handoffs) keep(ctx context.Context, off []*handoff) {
	if len(off) == 0 {
		return
	}
	n := hs.n
	clear := make([]store.Handoff, len(off))
	bs := make([]int, len(off))
	hs.mu.Lock()
	for i, h := range off {
		n.keeper.keep(h.bucket)
		hs.endLocked(h, HandoffCalledOff)
		clear[i] = store.Handoff{Bucket: h.bucket, Epoch: h.epoch}
		bs[i] = h.bucket
	}
	hs.mu.Unlock()
	n.log.Info("bucket hand-offs called off: serving the buckets again", zap.String("buckets", bucket.Of(bs...).String()))
	n.claimLoop.poke()
	n.scheduleLoop.poke()
	// A mark left behind ends with the lease's epoch; clearing it only
	// tells the fleet sooner.
	hs.write(ctx, "clearing called-off hand-offs", func(ctx context.Context) error {
		_, err := n.store.MarkHandoff(ctx, n.incarnation, clear)
		return err
	})
}

// endLocked ends h with outcome; hs.mu must be held.
func (hs *handoffs) endLocked(h *handoff, outcome string) {
	delete(hs.byBucket, h.bucket)
	close(hs.changed)
	hs.changed = make(chan struct{})
	if m, ok := hs.n.metrics.(HandoffMetrics); ok {
		m.HandoffEnded(outcome, hs.n.cfg.Clock.Now().Sub(h.started))
	}
}

// write runs one hand-off statement, bounded by a heartbeat: it is no
// renewal, and it must not outlast the next. It reports whether it
// succeeded, and logs why not.
func (hs *handoffs) write(ctx context.Context, what string, stmt func(context.Context) error) bool {
	n := hs.n
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(n.cfg.BucketLeaseHeartbeat, n.stmtTimeout))
	defer cancel()
	if err := stmt(wctx); err != nil {
		n.log.Warn(what+" failed; will try again while the leases last", zap.Error(err))
		return false
	}
	return true
}
