package node

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

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

// handoffs are the hand-offs of this node's buckets under way (DESIGN §6a).
// Each runs in a goroutine of its own, so that a bucket whose tasks have
// finished moves at once, whatever the others wait for:
//
//  1. the bucket is served no more (leaseKeeper.give): no claim, schedule,
//     rescue or prune there; its successor is marked in the store, so that
//     the fleet counts the bucket as the successor's already;
//  2. once every claim that could have named the bucket has registered its
//     attempts (claimMu), it waits until the bucket's attempts are settled:
//     their handlers have returned and their outcomes are written. At
//     HandoffTimeout it cancels those still running (ErrHandingOff), whose
//     tasks are then released to queued, no attempt counted;
//  3. it gives the lease to the successor under the next epoch
//     (Store.HandOff), which the store announces: the successor takes it up
//     at once, and no write of this node under the old epoch can land.
//
// A hand-off is called off when the assignment keeps the bucket here after
// all, and ends when the lease is lost first (the ordinary takeover then
// follows). A node that dies in the middle leaves an ordinary lease to
// lapse.
type handoffs struct {
	n  *Node
	mu sync.Mutex
	// byBucket are the hand-offs under way.
	byBucket map[int]*handoff
	wg       sync.WaitGroup
}

type handoff struct {
	bucket  int
	epoch   int64
	started time.Time
	// leaseCtx ends with the lease under epoch: a lost bucket ends the
	// hand-off.
	leaseCtx context.Context
	// cancel calls the hand-off off.
	cancel context.CancelFunc

	mu     sync.Mutex
	to     string // the successor's incarnation
	toNode string // and its node id
}

func (h *handoff) target() (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.to, h.toNode
}

func newHandoffs(n *Node) *handoffs {
	return &handoffs{n: n, byBucket: map[int]*handoff{}}
}

// start hands bucket b to the node toNode (incarnation to), or, when a
// hand-off of b is under way to another node, sends it there instead. It
// reports whether a hand-off of b is under way afterwards.
func (hs *handoffs) start(ctx context.Context, b int, to, toNode string) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.byBucket[b]; h != nil {
		h.mu.Lock()
		changed := h.to != to
		h.to, h.toNode = to, toNode
		h.mu.Unlock()
		if changed {
			hs.n.log.Info("bucket hand-off goes to another node", zap.Int("bucket", b), zap.Int64("epoch", h.epoch),
				zap.String("to", toNode))
			hs.mark(ctx, h)
		}
		return true
	}
	epoch, leaseCtx, ok := hs.n.keeper.give(b)
	if !ok {
		return false
	}
	hctx, cancel := context.WithCancel(ctx)
	h := &handoff{bucket: b, epoch: epoch, started: hs.n.cfg.Clock.Now(), leaseCtx: leaseCtx, cancel: cancel,
		to: to, toNode: toNode}
	hs.byBucket[b] = h
	hs.wg.Add(1)
	go func() {
		defer hs.wg.Done()
		outcome := hs.run(hctx, h)
		cancel()
		hs.mu.Lock()
		delete(hs.byBucket, b)
		hs.mu.Unlock()
		if m, ok := hs.n.metrics.(HandoffMetrics); ok {
			m.HandoffEnded(outcome, hs.n.cfg.Clock.Now().Sub(h.started))
		}
	}()
	return true
}

// callOff ends the hand-off of bucket b, if one is under way before the
// bucket was given: the node serves it again.
func (hs *handoffs) callOff(b int) {
	hs.mu.Lock()
	h := hs.byBucket[b]
	hs.mu.Unlock()
	if h != nil {
		h.cancel()
	}
}

// underWay returns the successor's node id of each hand-off under way, by
// bucket.
func (hs *handoffs) underWay() map[int]string {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make(map[int]string, len(hs.byBucket))
	for b, h := range hs.byBucket {
		_, out[b] = h.target()
	}
	return out
}

// wait waits until every hand-off under way has ended, or ctx ends; it
// reports whether they all ended.
func (hs *handoffs) wait(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		hs.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// stop calls every hand-off under way off and waits for them to end.
func (hs *handoffs) stop() {
	hs.mu.Lock()
	for _, h := range hs.byBucket {
		h.cancel()
	}
	hs.mu.Unlock()
	hs.wg.Wait()
}

// run carries one hand-off through and returns its outcome.
func (hs *handoffs) run(ctx context.Context, h *handoff) string {
	n := hs.n
	_, toNode := h.target()
	fields := []zap.Field{zap.Int("bucket", h.bucket), zap.Int64("epoch", h.epoch), zap.String("to", toNode)}
	n.log.Debug("handing a bucket over: no more claims there; waiting for its running tasks",
		append(fields, zap.Duration("timeout", n.cfg.HandoffTimeout))...)
	hs.mark(ctx, h)

	// A claim pass that read the held buckets before the bucket was given
	// registers what it claimed there before it lets go of claimMu: once
	// this hold is had, every attempt of the bucket is registered.
	n.holdClaims().release()

	expired := make(chan struct{})
	timer := n.cfg.Clock.AfterFunc(n.cfg.HandoffTimeout, func() { close(expired) })
	defer timer.Stop()
	for {
		left, changed := n.attempts.inBucket(h.bucket)
		if left == 0 {
			break
		}
		select {
		case <-changed:
		case <-expired:
			expired = nil
			cancelled := n.attempts.cancelBucket(h.bucket, ErrHandingOff)
			ids := make([]int64, len(cancelled))
			for i, a := range cancelled {
				ids[i] = a.ref.ID
			}
			sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
			n.log.Warn("hand-off timeout passed: cancelled the handlers still running in the bucket; "+
				"their tasks are released for the next holder", append(fields, zap.Int64s("tasks", ids))...)
		case <-ctx.Done():
			return hs.calledOff(h, fields)
		case <-h.leaseCtx.Done():
			n.log.Warn("bucket lease lost during its hand-off", fields...)
			return HandoffLost
		}
	}
	return hs.give(ctx, h, fields)
}

// give hands the lease over, trying again while the database does not
// answer, until the lease is lost or the hand-off called off.
func (hs *handoffs) give(ctx context.Context, h *handoff, fields []zap.Field) string {
	n := hs.n
	for {
		to, toNode := h.target()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
		handed, err := n.store.HandOff(sctx, n.incarnation, []store.Handoff{
			{Bucket: h.bucket, Epoch: h.epoch, To: to, ToNode: toNode},
		}, n.cfg.BucketLeaseTTL)
		cancel()
		switch {
		case err == nil && len(handed) == 1:
			n.keeper.handedOff(h.bucket, h.epoch)
			n.log.Info("bucket handed over", append(fields[:2:2], zap.String("to", toNode),
				zap.Int64("new_epoch", handed[0].Epoch),
				zap.Duration("took", n.cfg.Clock.Now().Sub(h.started)))...)
			return HandoffDone
		case err == nil:
			// The lease had moved on: this node no longer holds it.
			n.log.Warn("bucket not handed over: this node no longer holds it", fields...)
			n.keeper.handedOff(h.bucket, h.epoch)
			return HandoffLost
		}
		n.log.Warn("handing a bucket over failed; will retry while the lease lasts", append(fields, zap.Error(err))...)
		select {
		case <-ctx.Done():
			return hs.calledOff(h, fields)
		case <-h.leaseCtx.Done():
			return HandoffLost
		case <-sleepDone(ctx, n, n.cfg.BucketLeaseHeartbeat/4):
		}
	}
}

// sleepDone is closed once d has passed on the node's clock.
func sleepDone(ctx context.Context, n *Node, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	t := n.cfg.Clock.AfterFunc(d, func() { close(done) })
	context.AfterFunc(ctx, func() { t.Stop() })
	return done
}

// calledOff serves the bucket again and clears its mark.
func (hs *handoffs) calledOff(h *handoff, fields []zap.Field) string {
	n := hs.n
	n.keeper.keep(h.bucket)
	ctx, cancel := context.WithTimeout(context.Background(), n.stmtTimeout)
	defer cancel()
	if _, err := n.store.MarkHandoff(ctx, n.incarnation, []store.Handoff{{Bucket: h.bucket, Epoch: h.epoch}}); err != nil {
		n.log.Warn("clearing a called-off hand-off's mark failed; it ends with the lease's epoch", zap.Error(err))
	}
	n.log.Info("bucket hand-off called off: serving the bucket again", fields...)
	n.claimLoop.poke()
	n.scheduleLoop.poke()
	return HandoffCalledOff
}

// mark records the hand-off's successor in the store, for the fleet's
// view; a failure only delays what the others learn.
func (hs *handoffs) mark(ctx context.Context, h *handoff) {
	n := hs.n
	to, toNode := h.target()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	defer cancel()
	if _, err := n.store.MarkHandoff(mctx, n.incarnation, []store.Handoff{
		{Bucket: h.bucket, Epoch: h.epoch, To: to, ToNode: toNode},
	}); err != nil {
		n.log.Warn("recording a bucket's hand-off failed; handing it over all the same",
			zap.Int("bucket", h.bucket), zap.Error(err))
	}
}
