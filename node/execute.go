package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/task"
)

// Executor runs attempts. Execute must call run exactly once; it may do so
// in its own goroutine or before it returns. The node accounts for
// concurrency, cancellation and outcomes itself, so an executor only decides
// where the handler's code runs.
type Executor interface {
	Execute(run func())
}

// GoroutineExecutor runs each attempt in a goroutine of its own: the
// default.
type GoroutineExecutor struct{}

func (GoroutineExecutor) Execute(run func()) { go run() }

// InlineExecutor runs each attempt in the claim loop's goroutine, before the
// next task of the batch starts: one handler at a time, in claim order. It is
// meant for tests and for debugging a handler.
type InlineExecutor struct{}

func (InlineExecutor) Execute(run func()) { run() }

// errAttemptOver releases an attempt's context once its handler returned.
var errAttemptOver = errors.New("attempt over")

// attempt is one claimed attempt of a task on this node.
type attempt struct {
	// view is the handler's copy of the task; the fields below are the
	// node's own, so a handler that changes view cannot confuse the node.
	view    *task.Task
	handler Handler
	ref     task.Ref
	bucket  int
	epoch   int64
	number  int // attempt number, counting this one
	max     int // max attempts
	timeout clock.Timer

	ctx    context.Context
	cancel context.CancelCauseFunc

	// pauseRequested makes the handler's checkpoint answer task.ErrPaused.
	pauseRequested atomic.Bool

	// Guarded by Node.mu.
	done      bool  // the handler has returned
	abandoned error // why the attempt was given up without a write
	// stopCommand is the stop command applied to the attempt (0: none);
	// stopGrace abandons the handler if it has not returned in time.
	stopCommand int64
	stopGrace   clock.Timer
}

func (a *attempt) fields() []zap.Field {
	return []zap.Field{
		zap.Int64("task", a.ref.ID), zap.Int64("claim_seq", a.ref.ClaimSeq),
		zap.Int("bucket", a.bucket), zap.Int64("epoch", a.epoch), zap.Int("attempt", a.number),
	}
}

// launch starts a claimed task. The attempt joins the running set before
// the lease check, under the same lock as bucketsLost, so that a bucket lost
// at any moment either cancels the attempt there or is seen here.
func (n *Node) launch(t *task.Task) {
	h := n.handlers[t.Kind] // immutable after Start
	a := &attempt{
		view: t, handler: h, ref: t.Ref(), bucket: t.Bucket, epoch: t.Epoch,
		number: t.Attempt, max: t.MaxAttempts,
	}
	a.ctx, a.cancel = context.WithCancelCause(n.runCtx)
	t.BindAttempt(&attemptHooks{n: n, a: a})

	n.mu.Lock()
	n.running[a.ref] = a
	n.active++
	n.broadcastLocked()
	switch epoch, held := n.keeper.Holds(a.bucket); {
	case h == nil:
		// The claim asks only for registered kinds; a store that answered
		// with another is wrong, and the task is left to be rescued.
		a.abandoned = fmt.Errorf("kind %q is not registered on this node", t.Kind)
		a.cancel(a.abandoned)
	case !held || epoch != a.epoch:
		a.abandoned = ErrBucketLost
		a.cancel(ErrBucketLost)
	case n.draining:
		a.cancel(ErrShuttingDown)
	}
	n.mu.Unlock()

	if t.Timeout > 0 {
		a.timeout = n.cfg.Clock.AfterFunc(t.Timeout, func() { a.cancel(ErrTimeout) })
	}
	// Checked first: the fields of a line that is not written would cost
	// an allocation per task on the hot path.
	if ce := n.log.Check(zap.DebugLevel, "task started"); ce != nil {
		ce.Write(append(a.fields(), zap.String("kind", t.Kind))...)
	}
	n.cfg.Executor.Execute(func() { n.runAttempt(a) })
}

// runAttempt runs the handler, unless the attempt was cancelled before it
// started, and settles the attempt.
func (n *Node) runAttempt(a *attempt) {
	var err error
	if cause := context.Cause(a.ctx); cause != nil {
		err = cause
	} else {
		err = callHandler(a)
	}
	n.finish(a, err)
}

// callHandler runs the handler; a panic is a failed attempt whose error
// holds the panic value and the stack.
func callHandler(a *attempt) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return a.handler(a.ctx, a.view)
}

// panicError is a handler's panic, as the attempt's error.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	return fmt.Sprintf("handler panicked: %v\n\n%s", e.value, e.stack)
}

// finish settles an attempt whose handler has returned: an abandoned one is
// dropped without a write, any other has its outcome queued for the store.
func (n *Node) finish(a *attempt, err error) {
	if a.timeout != nil {
		a.timeout.Stop()
	}
	cause := context.Cause(a.ctx)
	a.cancel(errAttemptOver)

	n.mu.Lock()
	a.done = true // abandonLocked leaves it alone from here on: its outcome stands
	if a.stopGrace != nil {
		a.stopGrace.Stop()
	}
	abandoned := a.abandoned
	if abandoned != nil {
		delete(n.running, a.ref)
		n.handlerReturnedLocked()
	}
	n.mu.Unlock()

	if abandoned != nil {
		n.log.Warn("abandoned: "+abandonReason(abandoned), append(a.fields(), zap.NamedError("handler_error", err))...)
		n.claimLoop.poke()
		return
	}
	n.completer.add(a, n.decide(a, err, cause))
	// Counted as returned only once its outcome is queued, so that a
	// shutdown that sees no handler running finds every outcome queued.
	n.mu.Lock()
	n.handlerReturnedLocked()
	n.mu.Unlock()
}

// handlerReturnedLocked counts a handler out. n.mu must be held.
func (n *Node) handlerReturnedLocked() {
	n.active--
	n.broadcastLocked()
}

// abandonReason is the log message of an abandoned attempt.
func abandonReason(why error) string {
	switch {
	case errors.Is(why, ErrBucketLost):
		return "bucket lease lost"
	case errors.Is(why, ErrTaskLeaseLost):
		return "task lease not renewed"
	default:
		return why.Error()
	}
}

// abandonLocked gives an attempt up: its handler is cancelled, and nothing
// is written for it, since the store would fence the write. n.mu must be
// held.
func (n *Node) abandonLocked(a *attempt, why error) {
	if a.done || a.abandoned != nil {
		return
	}
	a.abandoned = why
	a.cancel(why)
	n.log.Warn("cancelling handler: "+abandonReason(why), a.fields()...)
}

// bucketsLost is the keeper's news of buckets this node must stop using:
// the handlers of their tasks are cancelled. An attempt claimed under the
// epoch the node holds now (the bucket was lost and taken again) is kept.
func (n *Node) bucketsLost(buckets []int) {
	lost := bucket.Of(buckets...)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range n.running {
		if !lost.Contains(a.bucket) {
			continue
		}
		if epoch, held := n.keeper.Holds(a.bucket); held && epoch == a.epoch {
			continue
		}
		n.abandonLocked(a, ErrBucketLost)
	}
}

// validResult reports whether a handler's result can be stored.
func validResult(r json.RawMessage) bool {
	return len(r) == 0 || json.Valid(r)
}
