package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// maxCompletionBatch bounds one AdvanceActive call, so that a backlog of
// outcomes is written in statements of a size the database handles well.
const maxCompletionBatch = 1000

// Bounds of the pause before a failed outcome write is tried again.
const (
	completionRetryMin = 100 * time.Millisecond
	completionRetryMax = 5 * time.Second
)

// completion is the outcome of one attempt, waiting to be written.
type completion struct {
	a  *attempt
	tr store.ActiveTransition
	// unsure is set once a write of it failed: that write may have
	// committed, and a fenced answer to the next is read back
	// (confirmUnsure).
	unsure bool
}

// completer writes outcomes to the store in batches. It flushes as soon as
// an outcome arrives, so a lone completion waits for one statement only;
// outcomes that arrive while a flush is in flight pile up and go together
// in the next one. Batching thus costs no latency, and under load a
// thousand outcomes take one statement instead of a thousand.
type completer struct {
	n    *Node
	loop *loop

	mu      sync.Mutex
	queue   []completion
	stopped bool
}

func newCompleter(n *Node) *completer {
	return &completer{n: n, loop: newLoop("completer")}
}

// add queues an attempt's outcome.
func (c *completer) add(a *attempt, tr store.ActiveTransition) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		// Only a handler that outlived Shutdown's deadline gets here; its
		// task lease will lapse and the bucket's next holder rescues it.
		c.n.log.Warn("outcome not recorded: the node has stopped", append(a.fields(), zap.String("to", string(tr.To)))...)
		c.n.settle([]*attempt{a})
		return
	}
	c.queue = append(c.queue, completion{a: a, tr: tr})
	c.mu.Unlock()
	c.loop.poke()
}

// take removes up to maxCompletionBatch outcomes from the queue.
func (c *completer) take() []completion {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(len(c.queue), maxCompletionBatch)
	batch := append([]completion(nil), c.queue[:k]...)
	c.queue = c.queue[k:]
	return batch
}

// putBack returns a batch whose write failed to the front of the queue.
func (c *completer) putBack(batch []completion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = append(batch, c.queue...)
}

// run flushes until the loop stops, then drains what is left.
func (c *completer) run(ctx context.Context) {
	retry := completionRetryMin
	for {
		select {
		case <-ctx.Done():
			c.drain(ctx)
			return
		case <-c.loop.wake:
		}
		for {
			batch := c.take()
			if len(batch) == 0 {
				break
			}
			if c.flush(ctx, batch) {
				retry = completionRetryMin
				continue
			}
			// The database is unreachable, or slow: keep the outcomes and
			// try again. The task leases are still renewed meanwhile.
			for i := range batch {
				batch[i].unsure = true
			}
			c.putBack(batch)
			if !sleep(ctx, c.n.cfg.Clock, retry) {
				break
			}
			retry = min(2*retry, completionRetryMax)
		}
	}
}

// drain writes every outcome still queued, once, and refuses new ones. It
// runs at shutdown, after every handler has returned.
func (c *completer) drain(ctx context.Context) {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	for {
		batch := c.take()
		if len(batch) == 0 {
			return
		}
		if !c.flush(ctx, batch) {
			attempts := make([]*attempt, len(batch))
			for i, cp := range batch {
				attempts[i] = cp.a
				c.n.log.Warn("outcome not recorded at shutdown; the task will be rescued when its lease expires",
					append(cp.a.fields(), zap.String("to", string(cp.tr.To)))...)
			}
			c.n.settle(attempts)
		}
	}
}

// flush writes one batch and reports whether the store answered. The write
// runs on its own timeout, not the loop's context, so that a stop does not
// cut a write whose result the store may already have committed.
func (c *completer) flush(ctx context.Context, batch []completion) bool {
	n := c.n
	if n.flushAndClaim(ctx, batch) {
		return true
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	sent := n.cfg.Clock.Now()
	outcomes, err := n.store.AdvanceActive(wctx, n.incarnation, transitions(batch))
	cancel()
	if err != nil {
		n.metrics.Flushed(nil, n.cfg.Clock.Now().Sub(sent), err)
		n.log.Warn("recording task outcomes failed; will retry", zap.Int("tasks", len(batch)), zap.Error(err))
		return false
	}
	n.confirmUnsure(ctx, batch, outcomes)
	n.metrics.Flushed(n.finished(batch, outcomes), n.cfg.Clock.Now().Sub(sent), nil)
	n.written(batch, outcomes)
	return true
}

// transitions are the batch's moves, in its order.
func transitions(batch []completion) []store.ActiveTransition {
	trs := make([]store.ActiveTransition, len(batch))
	for i, cp := range batch {
		trs[i] = cp.tr
	}
	return trs
}

// written logs what became of each attempt of a written batch and settles
// them: their slots are free.
func (n *Node) written(batch []completion, outcomes []store.Outcome) {
	attempts := make([]*attempt, len(batch))
	for i, cp := range batch {
		attempts[i] = cp.a
		if i >= len(outcomes) {
			n.log.Error("the store gave no outcome for a task; it will be rescued when its lease expires", cp.a.fields()...)
			continue
		}
		n.logOutcome(cp, outcomes[i])
	}
	n.settle(attempts)
}

// logOutcome logs what became of one attempt.
func (n *Node) logOutcome(cp completion, o store.Outcome) {
	if o.Err == nil && o.Status == task.Succeeded {
		// The common case, logged at debug level: checked first, since
		// building the fields of a line that is not written costs
		// allocations per task.
		if ce := n.log.Check(zap.DebugLevel, "task succeeded"); ce != nil {
			ce.Write(append(cp.a.fields(), zap.String("status", string(o.Status)))...)
		}
		return
	}
	fields := append(cp.a.fields(), zap.String("status", string(o.Status)))
	switch {
	case errors.Is(o.Err, store.ErrFenced):
		n.log.Warn("fenced: the attempt was superseded; its outcome was not recorded",
			append(fields, zap.String("outcome", string(cp.tr.To)))...)
	case o.Err != nil:
		// A bug, never an expected event: tests fail on it (refusals).
		n.refusals.Add(1)
		n.log.Error("recording the task's outcome was refused",
			append(fields, zap.String("outcome", string(cp.tr.To)), zap.Error(o.Err))...)
	case o.Status == task.Retrying:
		n.log.Info("task attempt failed; retrying",
			append(fields, zap.Duration("delay", cp.tr.Delay), zap.String("error", cp.tr.Error))...)
	case o.Status == task.Queued:
		n.log.Info("task released at shutdown", fields...)
	default:
		n.log.Info("task finished", append(fields, zap.String("reason", cp.tr.Reason), zap.String("error", cp.tr.Error))...)
	}
}

// settle removes attempts whose outcome is written or given up from the
// registry: their slots are free. What each holds under the limits is
// freed once its handler has returned too (a handler abandoned after a
// stop's grace may still run, and holds its resources until it returns).
func (n *Node) settle(attempts []*attempt) {
	n.attempts.settle(attempts)
	for _, a := range attempts {
		n.releaseLimits(a, false, true)
	}
	n.claimLoop.poke()
}

// releaseLimits records one end of an attempt and, once both its handler
// has returned and its outcome is written or given up, frees what it
// holds in the limiter: once, for every way an attempt ends (outcome
// written or fenced, abandoned, released at shutdown, stopped past its
// grace).
func (n *Node) releaseLimits(a *attempt, returned, settled bool) {
	if a.over(returned, settled) {
		n.limits.release(a.ref)
	}
}

// confirmUnsure reads back the trail of each task whose outcome write is
// unsure (an earlier write of it failed, and may have committed: a
// connection cut after the commit, as in a database failover) and that the
// store answered fenced now. When the trail holds this attempt's own move
// out of its active state (this node, the attempt's epoch and number, and
// the reason it wrote), the earlier write committed: the outcome
// is recorded, not fenced. Otherwise, or when the trail cannot be read, the
// answer stands.
func (n *Node) confirmUnsure(ctx context.Context, batch []completion, outcomes []store.Outcome) {
	for i, cp := range batch {
		if !cp.unsure || i >= len(outcomes) || !errors.Is(outcomes[i].Err, store.ErrFenced) {
			continue
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
		events, err := n.store.TaskEvents(rctx, cp.a.ref.ID)
		cancel()
		if err != nil {
			n.log.Warn("reading back a task whose outcome write was unsure failed; taking it as fenced",
				append(cp.a.fields(), zap.Error(err))...)
			continue
		}
		for _, e := range events {
			if e.From.Active() && !e.To.Active() && e.Node == n.id && e.Epoch == cp.a.epoch &&
				e.Attempt == cp.a.number && e.Reason == cp.tr.Reason {
				outcomes[i] = store.Outcome{ID: cp.a.ref.ID, Status: e.To}
				n.log.Info("outcome recorded by an earlier write whose answer was lost",
					append(cp.a.fields(), zap.String("status", string(e.To)))...)
				break
			}
		}
	}
}
