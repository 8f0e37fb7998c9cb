package node

import (
	"context"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
)

// Shutdown leaves the fleet gracefully:
//
//  1. it stops claiming, tells the fleet it is leaving, and starts handing
//     each bucket it holds to the node that declares it and that the
//     fleet's assignment without this node gives it to (handOffAtShutdown):
//     a bucket moves as soon as its own tasks are settled, within
//     HandoffTimeout;
//  2. it lets running handlers finish for up to ShutdownTimeout, while
//     their task leases and the bucket leases are still renewed;
//  3. it cancels the handlers still running (cause ErrShuttingDown) and,
//     once each has returned, releases its task to queued without counting
//     the attempt (a pending stop turns it into stopped instead);
//     A pausing task whose handler returns without reaching a checkpoint
//     is released to paused instead, its saved progress kept;
//  4. it writes every outcome still queued, waits for the hand-offs
//     (finishHandoffs), stops the loops, releases the bucket leases it still
//     holds (announced, so a standby takes over at once) and marks the node
//     stopped.
//
// ctx bounds the whole: when it ends (a forced exit), Shutdown cancels the
// handlers still running, waits ForcedExitGrace for them to return, and
// goes on without those that have not, naming their tasks in its error
// and its log. The buckets of
// those handlers' tasks are not released: their leases lapse as after a
// crash, so the next holder takes such a bucket, and rescues the task, only
// once the database's expiry has passed, never while the handler may still
// be running in this process. Calling Shutdown again returns the first
// call's answer; Shutdown without Start only marks the node stopped.
func (n *Node) Shutdown(ctx context.Context) error {
	n.life.Lock()
	defer n.life.Unlock()
	n.mu.Lock()
	st := n.state
	n.state = stateStopped
	n.mu.Unlock()
	switch st {
	case stateNew:
		return nil
	case stateStopped:
		return n.shutdownErr
	}
	n.shutdownErr = n.shutdown(ctx)
	return n.shutdownErr
}

func (n *Node) shutdown(ctx context.Context) error {
	n.log.Info("shutting down: no new claims; waiting for running handlers",
		zap.Int("running", n.activeHandlers()), zap.Duration("timeout", n.cfg.ShutdownTimeout))
	n.draining.Store(true)
	// Not waited for yet: under the inline executor the claim loop is the
	// goroutine running a handler.
	n.claimLoop.signalStop()
	n.scheduleLoop.stop() // the leases go soon: their schedules are the successor's
	n.limitLoop.stop()
	n.shareLoop.stop()
	n.listenLoop.stop()
	n.handOffAtShutdown(ctx)

	expired := make(chan struct{})
	timer := n.cfg.Clock.AfterFunc(n.cfg.ShutdownTimeout, func() { close(expired) })
	drained := n.waitHandlers(ctx, expired)
	timer.Stop()

	var err error
	if !drained {
		n.cancelRunning()
		if !n.waitHandlers(ctx, nil) {
			// ctx has ended (a forced exit): the handlers were just
			// cancelled, and most return at once. A short bounded moment
			// lets them, so that their tasks are released and their
			// buckets handed over rather than left running until their
			// leases lapse.
			over, stop := n.forcedGrace()
			n.waitHandlers(context.Background(), over)
			stop()
			if left := n.runningTasks(); len(left) > 0 {
				n.log.Error("forced exit: handlers still running after their cancellation; "+
					"their tasks will be rescued when their leases lapse, and their buckets are left to lapse",
					zap.Int64s("tasks", left), zap.String("buckets", n.bucketsStillRunning().String()),
					zap.Duration("waited", ForcedExitGrace))
				err = fmt.Errorf("node %s: %d handlers did not return before the shutdown deadline (tasks %v): %w",
					n.id, len(left), left, context.Cause(ctx))
			}
		}
	}

	// Stops keep being applied while handlers drain.
	n.commander.loop.stop()
	n.claimLoop.stopWithin(ctx)
	n.completer.loop.stop() // writes every outcome queued so far
	n.finishHandoffs(ctx)
	n.rescuer.loop.stop()
	n.pruner.loop.stop()
	n.renewer.loop.stop()
	n.heartbeatLoop.stop()
	n.leaseLoop.stop()
	n.keeper.release(ctx, n.bucketsStillRunning())
	n.limits.releaseShares(ctx) // with the buckets: the node claims nothing more
	n.keeper.stopTimer()
	n.stopRegistration(ctx)
	n.stopRun(ErrShuttingDown)
	n.log.Info("node stopped")
	return err
}

// ForcedExitGrace is how long Shutdown waits, once its context has ended,
// for the handlers it has just cancelled to return: a handler that honours
// its context returns within it, and its task is released and its bucket
// handed over; one that does not is left, as after a crash.
const ForcedExitGrace = time.Second

// forcedGrace returns a channel closed once ForcedExitGrace has passed,
// and the function that stops its timer.
func (n *Node) forcedGrace() (<-chan struct{}, func()) {
	over := make(chan struct{})
	timer := n.cfg.Clock.AfterFunc(ForcedExitGrace, func() { close(over) })
	return over, func() { timer.Stop() }
}

// runningTasks lists the tasks whose handler has not returned, by id.
func (n *Node) runningTasks() []int64 {
	var ids []int64
	for _, a := range n.attempts.all() {
		if done, _ := a.state(); !done {
			ids = append(ids, a.ref.ID)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// waitHandlers waits until the claim loop has ended and every handler has
// returned; it gives up when ctx ends or expired is closed, but not before
// it has looked once, so that a finished drain is seen as finished even
// when ctx has ended meanwhile.
func (n *Node) waitHandlers(ctx context.Context, expired <-chan struct{}) bool {
	loopEnded := n.claimLoop.ended()
	for {
		select {
		case <-loopEnded:
			loopEnded = nil // ended; a nil channel is never selected again
		default:
		}
		_, active, changed := n.attempts.counts()
		if active == 0 && loopEnded == nil {
			return true
		}
		select {
		case <-changed:
		case <-loopEnded:
		case <-expired:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// cancelRunning cancels every handler still running, for release.
func (n *Node) cancelRunning() {
	var cancelled []*attempt
	for _, a := range n.attempts.all() {
		if done, abandoned := a.state(); !done && abandoned == nil {
			a.cancel(ErrShuttingDown)
			cancelled = append(cancelled, a)
		}
	}
	sort.Slice(cancelled, func(i, j int) bool { return cancelled[i].ref.ID < cancelled[j].ref.ID })
	ids := make([]int64, len(cancelled))
	for i, a := range cancelled {
		ids[i] = a.ref.ID
		n.log.Warn("shutting down: cancelling handler; its task will be released once it returns", a.fields()...)
	}
	if len(ids) > 0 {
		n.log.Warn("cancelled the handlers still running at shutdown", zap.Int64s("tasks", ids))
	}
}

func (n *Node) activeHandlers() int {
	_, active, _ := n.attempts.counts()
	return active
}

// bucketsStillRunning returns the buckets of the attempts whose handler has
// not returned: their leases must lapse rather than be handed over.
func (n *Node) bucketsStillRunning() bucket.Set {
	var bs []int
	for _, a := range n.attempts.all() {
		if done, _ := a.state(); !done {
			bs = append(bs, a.bucket)
		}
	}
	return bucket.Of(bs...)
}
